"""The engine's composition root, solutions/minisgl/features.py (docs/maintainers.md, "How the
engine is put together"): its rows load, follow the chapters, and are the only way a later
chapter joins; package __init__ files only re-export."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from course.manifest import Course
from course.snapshot import assemble_file
from course.source import FEATURES, module_file, module_path
from minisgl import features

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "solutions" / "minisgl"
COURSE = Course.load(ROOT)
TABLES = {
    name: table
    for name, table in vars(features).items()
    if isinstance(table, tuple) and table and all(isinstance(p, features.Part) for p in table)
}


def owner(part: features.Part) -> int:
    """The chapter whose `new` files hold the module a row names."""
    path = module_path(part.target.partition(":")[0])
    return min(COURSE.file_owner.get(p, 99) for p in (f"{path}.py", f"{path}/__init__.py"))


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_row_loads_and_belongs_to_the_chapter_of_its_module(name: str) -> None:
    table = TABLES[name]
    assert [part.chapter for part in table] == sorted(part.chapter for part in table), (
        f"{name} is not in chapter order"
    )
    for part in table:
        assert part.load() is not None, part
        assert part.chapter == owner(part), f"{part.target} is a file of chapter {owner(part)}"


def test_find_knows_names_and_aliases_and_a_registry_reads_like_a_dict() -> None:
    assert features.find(features.ATTENTION_BACKENDS, "fi") is features.find(
        features.ATTENTION_BACKENDS, "flashinfer"
    )
    assert features.find(features.ATTENTION_BACKENDS, "nothing") is None
    registry = features.Registry(features.SCHEDULERS, base={"x": int})
    assert list(registry) == ["x", "one process", "several processes"] and len(registry) == 3
    assert registry["x"] is int and "nothing" not in registry


@pytest.mark.parametrize("k", [k for k in sorted(COURSE.chapters) if k >= 3])
def test_snapshot_k_lists_exactly_the_rows_whose_module_it_holds(k: int) -> None:
    text = assemble_file(COURSE, FEATURES, k, "reference")[0]
    namespace: dict = {}
    exec(compile(text, FEATURES, "exec"), namespace)  # noqa: S102 - the course's own file
    present = COURSE.files(k)
    for name, table in TABLES.items():
        expected = [p.target for p in table if module_file(p.target.partition(":")[0], present)]
        assert [p.target for p in namespace[name]] == expected, (k, name)


def test_package_inits_only_re_export_and_no_module_registers_itself() -> None:
    """A later chapter joins through a row of features.py: no __init__ imports a module of
    another package for its side effects, and no module changes another module's table."""
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(ENGINE)
        for node in tree.body:
            if path.name == "__init__.py" and isinstance(node, ast.ImportFrom) and node.level == 0:
                package = ".".join(("minisgl", *where.parent.parts))
                assert node.module == package or not node.module.startswith("minisgl"), (
                    f"{where}:{node.lineno} imports {node.module} from another package"
                )
            targets = node.targets if isinstance(node, ast.Assign) else []
            assert not any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in targets), (
                f"{where}:{node.lineno}: a module-level assignment into another object"
            )
            call = node.value if isinstance(node, ast.Expr) else None
            assert not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("append", "extend", "update", "register")
            ), f"{where}:{node.lineno}: a module-level registration"


def test_a_student_who_edited_the_table_gets_the_new_chapters_rows() -> None:
    """`start K` merges a modified file; for features.py, chapter K's rows are what must run,
    so the student's copy (kept as a backup by `start`) gives way to the new table."""
    from course.snapshot import skeleton_text
    from course.workspace import merge_modified

    mine = skeleton_text(COURSE, FEATURES, 3).replace("MODELS", "MODELS  # mine", 1)
    new = skeleton_text(COURSE, FEATURES, 20)
    merged, notes = merge_modified(COURSE, FEATURES, 20, mine, new)
    assert merged == new and "Qwen3MoeForCausalLM" in merged
    assert notes and "backup" in notes[0]
