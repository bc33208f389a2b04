"""Sharding an epoch's batches among ranks: disjoint, covering, the same number of steps on each."""

import pytest
from helpers import as_lists

from transformer.core.batches import make_batches
from transformer.training.ranks import shard


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_disjoint_and_covering(lengths, world_size, shuffle):
    batches = make_batches(*lengths, max_tokens=1000, shuffle=shuffle, seed=5, epoch=2)
    whole = as_lists(batches)
    shards = [as_lists(shard(batches, rank, world_size)) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1  # every rank takes the same number of steps
    n_extra = len(shards[0]) * world_size - len(whole)
    assert 0 <= n_extra < world_size
    taken = [batch for shard in shards for batch in shard]
    assert sorted(taken) == sorted(whole + whole[:n_extra])  # padded by repeating from the start
    with pytest.raises(ValueError, match="rank"):
        shard(batches, world_size, world_size)
