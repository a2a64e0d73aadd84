"""A seeded build draws from a generator of its own (anatomy/initialization.py): the same seed gives
the same weights in any thread, whatever other threads draw meanwhile, and torch's global
generator is left as it was."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import anatomy

CONFIGS = {
    "decoder": anatomy.preset("toy"),
    "encoder": anatomy.preset("toy").replace(arch="encoder", head="masked-lm"),
    "encoder-decoder": anatomy.preset("toy").replace(arch="encoder-decoder"),
    "mixture of experts": anatomy.preset("toy").replace(n_experts=4, n_experts_per_token=2),
}


def weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_a_seeded_build_leaves_the_global_generator_as_it_was(arch):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    anatomy.build_model(CONFIGS[arch], seed=5)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_a_seeded_build_is_the_same_whatever_was_drawn_before(arch):
    first = weights(anatomy.build_model(CONFIGS[arch], seed=5))
    torch.randn(1000)
    assert same(first, weights(anatomy.build_model(CONFIGS[arch], seed=5)))
    assert not same(first, weights(anatomy.build_model(CONFIGS[arch], seed=6)))


def test_seeded_builds_in_parallel_threads_equal_the_same_builds_made_alone():
    jobs = [(arch, seed) for seed in range(10) for arch in CONFIGS]  # 40 builds, each made twice below
    alone = {job: weights(anatomy.build_model(CONFIGS[job[0]], seed=job[1])) for job in jobs}

    def build(job):
        if job[1] % 5 == 0:  # an unseeded build meanwhile draws from the global generator
            anatomy.build_model(CONFIGS[job[0]])
        return job, weights(anatomy.build_model(CONFIGS[job[0]], seed=job[1]))

    with ThreadPoolExecutor(max_workers=4) as pool:
        together = dict(pool.map(build, jobs * 2))
    differ = [job for job in jobs if not same(alone[job], together[job])]
    assert differ == [], f"{len(differ)} of {len(jobs)} seeded builds differ from the same build made alone"
