"""The tests' own layout: test files live in one folder per room, each a package, and none
is so long that its behaviours should be told apart by file."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MAX_LINES = 500


def test_no_test_file_lies_at_the_top_of_tests() -> None:
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == []


def test_each_room_is_a_package_with_a_docstring() -> None:
    rooms = [path for path in TESTS.iterdir() if any(path.glob("test_*.py"))]
    for room in rooms:
        if room.name == "image":  # make image-test runs it on its own, as a folder
            continue
        init = room / "__init__.py"
        assert init.is_file(), f"{room.name}/ has no __init__.py"
        assert init.read_text(encoding="utf-8").startswith('"""'), f"{room.name}/: no docstring"


def test_no_test_file_is_over_500_lines() -> None:
    long = {
        path.relative_to(TESTS).as_posix(): lines
        for path in TESTS.glob("*/test_*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
