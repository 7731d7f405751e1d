"""Tuning's choices remembered between processes (``backends.cupy.calls.choices``): the store alone, without a GPU."""

import json
import os

import numpy as np

from cortado.backends.cupy.calls import choices


def test_a_choice_comes_back_from_disk_as_the_process_kept_it(fresh_choices):
    choices.remember("cublaslt", ("shape", 3, 1.0), ["00ff", (1e-3, 2e-3), {"gemm": 4e-3}])
    kept = choices.recall("cublaslt", ("shape", 3, 1.0))
    assert kept == ["00ff", [1e-3, 2e-3], {"gemm": 4e-3}]  # lists, as a later process reads them
    choices.forget()  # a later process: only the disk remembers
    assert choices.recall("cublaslt", ("shape", 3, 1.0)) == kept
    assert choices.recall("cudnn", ("shape", 3, 1.0)) is None  # another kind of call
    assert choices.recall("cublaslt", ("shape", 3, 2.0)) is None


def test_processes_writing_one_after_another_keep_each_others_choices(fresh_choices):
    choices.remember("int8", "first", [0, [1.0]])
    choices.forget()  # another process, which has not read the file yet
    choices.remember("int8", "second", [1, [2.0]])
    choices.forget()
    assert choices.recall("int8", "first") == [0, [1.0]] and choices.recall("int8", "second") == [1, [2.0]]


def test_an_unreadable_file_is_no_choice_and_is_written_over(fresh_choices):
    path = choices._path("int8", "key")
    with open(path, "w") as file:
        file.write('[2, [3.0')
    assert choices.recall("int8", "key") is None
    choices.remember("int8", "key", [2, [3.0]])
    with open(path) as file:
        assert json.load(file) == [2, [3.0]]


def test_keys_equal_as_values_share_a_choice_in_the_process(fresh_choices):
    choices.remember("cublaslt", (np.float32(0.5), (np.int64(3), 4)), "algorithm 7")
    assert choices.recall("cublaslt", (0.5, (3, 4))) == "algorithm 7"


def test_where_the_file_cannot_be_written_the_process_still_remembers(fresh_choices, monkeypatch):
    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(choices, "write_atomically", full_disk)
    choices.remember("cudnn", "key", ["plan", None, {}])
    assert choices.recall("cudnn", "key") == ["plan", None, {}]
    assert not os.path.exists(choices._path("cudnn", "key"))
