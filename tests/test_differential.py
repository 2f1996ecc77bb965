"""The differential harness (tools/course/differential.py) on the reference tree: what it
compares, what it reports, and that it leaves the student's modules as they were."""

from __future__ import annotations

import pytest
import torch
from course.differential import (
    Tolerance,
    assert_same_call,
    call_differences,
    differences,
    first_difference,
    reference_function,
    use_reference_stubs,
)

from minisgl.scheduler import decode
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.scheduler import Scheduler


def test_the_reference_body_runs_with_the_students_globals_and_leaves_the_module_alone():
    before = dict(vars(decode))
    function = reference_function(DecodeManager, "schedule_next_batch")
    assert function.__globals__ is vars(decode), "it must see the student's classes"
    assert function.__code__.co_filename.endswith("solutions/minisgl/scheduler/decode.py")
    assert dict(vars(decode)) == before, "compiling it bound nothing in the student's module"
    assert function(DecodeManager(4)) is None


def test_a_wrong_result_fails_naming_the_stub_and_both_sides():
    def schedule_next_batch(self):  # noqa: ANN001, ANN202 - a student's mistake
        return decode.Batch(list(self.running_reqs.values()), "decode")

    schedule_next_batch.__module__ = decode.__name__
    schedule_next_batch.__qualname__ = "DecodeManager.schedule_next_batch"
    with pytest.raises(AssertionError) as error:
        assert_same_call(schedule_next_batch, DecodeManager(4))
    message = str(error.value)
    assert message.startswith(
        "DecodeManager.schedule_next_batch (minisgl/scheduler/decode.py) differs"
    )
    assert "yours Batch(reqs=[], phase='decode'), the reference's None" in message


def test_results_compare_by_dtype_shape_and_value_within_the_tolerance():
    x = torch.ones(3, dtype=torch.bfloat16)
    assert differences(x, x.clone()) == []
    assert "(dtype)" in differences(x.float(), x)[0]
    assert "(shape)" in differences(x[:2], x)[0]
    assert differences(x + 0.01, x)  # exact unless a tolerance is given
    assert differences(x.float() + 1e-3, x.float(), tolerance=Tolerance(atol=1e-2)) == []
    assert differences({"a": [1, 2]}, {"a": [1, 3]}) == [
        "result['a'][1]: yours 2, the reference's 3"
    ]


def test_raising_where_the_reference_returns_is_a_difference():
    def remove_req(self, req):  # noqa: ANN001, ANN202 - forgets a request may have left already
        del self.running_reqs[req.uid]

    remove_req.__module__ = decode.__name__
    remove_req.__qualname__ = "DecodeManager.remove_req"
    stranger = type("Stranger", (), {"uid": 7})()
    found = call_differences(remove_req, DecodeManager(4), stranger)
    assert found and found[0].startswith("raised: yours KeyError")


def test_the_chapters_reference_stubs_come_and_go():
    mine = Scheduler.__dict__["append_tokens"]
    with use_reference_stubs(7):
        assert Scheduler.__dict__["append_tokens"] is not mine
        assert Scheduler.append_tokens.__qualname__ == "reference Scheduler.append_tokens"
    assert Scheduler.__dict__["append_tokens"] is mine


def test_two_traces_part_at_their_first_different_event():
    assert first_difference(["a", "b"], ["a", "b"]) is None
    assert (
        first_difference(["a", "x"], ["a", "b"])
        == "event 2 after 'a': yours 'x'; the reference's 'b'"
    )
    assert "yours ends after 1 events" in first_difference(["a"], ["a", "b"])
