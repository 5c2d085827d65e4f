import profiler.engine as sim
from tests.exports import assert_exports


def test_public_exports():
    assert_exports(sim, {
        "BatchShape", "CacheObserver", "CostModel", "Engine", "EngineConfig", "EngineStats",
        "LinearCost", "Link", "ModelShape", "Outcome", "Phase", "PrefixCache",
        "Request",
        "RequestRejected", "SchedulePolicy", "Sequence", "SharedLink", "SimResult",
        "StepResult", "block_hashes", "load_cost", "load_link", "load_model_shape", "simulate",
    })
