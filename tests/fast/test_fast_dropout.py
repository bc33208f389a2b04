"""Our CPU dropout: the right fraction dropped, the expectation kept, repeatable, identity in eval mode."""

import pytest
import torch

from transformer.fast.dropout import Dropout, dropout, relu_dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_a_fraction_p_and_keeps_the_expectation(p):
    y = dropout(torch.ones(2_000_000), p)
    assert (y == 0).float().mean().item() == pytest.approx(p, abs=2e-3)
    assert y.mean().item() == pytest.approx(1.0, abs=3e-3)
    values = torch.unique(y).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p), rel=1e-4)


def test_mask_is_not_periodic_across_the_four_16_bit_slices():
    y = dropout(torch.ones(400_000), 0.5).view(-1, 4)  # each row came from one 64-bit word
    dropped = (y == 0).float().mean(dim=0)
    assert torch.allclose(dropped, torch.full((4,), 0.5), atol=5e-3)


def test_the_four_16_bit_slices_of_a_word_are_independent():
    """Each slot alone drops p: a dropout reusing one random number for all four slots would too. Jointly,
    independent slots drop together with probability p² (pairs) and p⁴ (all four); reuse gives p."""
    p = 0.3
    dropped = (dropout(torch.ones(800_000), p) == 0).view(-1, 4).float()  # (words, 4 slots)
    for i in range(4):
        for j in range(i + 1, 4):
            both = (dropped[:, i] * dropped[:, j]).mean().item()
            assert both == pytest.approx(p * p, abs=3e-3), (i, j)
    assert dropped.prod(dim=1).mean().item() == pytest.approx(p**4, abs=1.5e-3)
    assert dropped.sum(dim=1).mean().item() == pytest.approx(4 * p, abs=6e-3)  # the joint drop rate


def test_gradient_is_the_same_mask_scaled():
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.2)
    y.sum().backward()
    kept = y != 0
    assert torch.all(x.grad[~kept] == 0)
    torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 65536 / (65536 - 13107)))


def test_repeatable_under_the_global_seed_and_identity_in_eval():
    x = torch.randn(1000)
    torch.manual_seed(3)
    a = dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.1))
    module = Dropout(0.1).eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_keeps_low_precision_dtypes(dtype):
    assert dropout(torch.ones(100, dtype=dtype), 0.1).dtype == dtype


def test_equals_the_plain_mask_product_and_keeps_only_a_one_byte_mask():
    """x · (0 or 1/(1-p)) as the plain product with the same random draws, gradient included, bit for bit;
    what autograd keeps for the backward pass is the boolean mask, not a mask in x's dtype."""
    x = torch.randn(37, 50, requires_grad=True)
    torch.manual_seed(5)
    y = dropout(x, 0.1)
    torch.manual_seed(5)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    numbers = words.view(torch.int16)[: x.numel()].view(x.shape)
    mask = torch.where(numbers < round(0.1 * 65536) - 32768, 0.0, 65536 / (65536 - round(0.1 * 65536)))
    assert torch.equal(y, x * mask)
    assert [t.dtype for t in y.grad_fn.saved_tensors] == [torch.bool]
    upstream = torch.randn(37, 50)
    (grad,) = torch.autograd.grad(y, x, upstream)
    assert torch.equal(grad, upstream * mask)


def test_relu_dropout_equals_dropout_of_relu_and_keeps_one_byte_mask():
    x = torch.randn(41, 64, requires_grad=True)
    torch.manual_seed(9)
    y = relu_dropout(x, 0.1)
    assert [t.dtype for t in y.grad_fn.saved_tensors] == [torch.bool]
    torch.manual_seed(9)
    expected = dropout(torch.relu(x), 0.1)
    assert torch.equal(y, expected)
    upstream = torch.randn(41, 64)
    assert torch.equal(torch.autograd.grad(y, x, upstream)[0], torch.autograd.grad(expected, x, upstream)[0])
    assert (y == 0).float().mean() > 0.5  # the negatives and the dropped: both zero
    eval_x = torch.randn(8)
    assert torch.equal(relu_dropout(eval_x, 0.1, training=False), torch.relu(eval_x))


def test_relu_dropout_when_decoding_overwrites_its_input_and_keeps_autograd_otherwise():
    x = torch.randn(6, 32)
    want = torch.relu(x)
    with torch.no_grad():
        y = relu_dropout(x, 0.1, training=False)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, want)  # no new (B, T, d_ff) tensor
    leaf = torch.randn(6, 32, requires_grad=True)
    before = leaf.detach().clone()
    relu_dropout(leaf * 1.0, 0.1, training=False).sum().backward()  # eval mode with autograd: not in place
    assert torch.equal(leaf.detach(), before) and torch.equal(leaf.grad, (leaf > 0).float())


def test_under_torch_compile_it_is_f_dropout_in_one_graph():
    """The CPU mask's draw would break torch.compile's graph: compiled, the twin is F.dropout (the same
    random stream as F.dropout eager), and the traced function has no graph break."""
    import torch._dynamo

    x = torch.randn(8, 64)
    torch.manual_seed(1)
    expected = torch.relu(torch.nn.functional.dropout(x, 0.3))
    for function in (lambda x: relu_dropout(x.clone(), 0.3), lambda x: torch.relu(dropout(x, 0.3))):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(function)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        torch.manual_seed(1)
        assert torch.equal(torch.compile(function, backend="eager")(x), expected)
