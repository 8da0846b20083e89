"""benchmarks/template_ablation.py on the CPU: every variant still applies to the templates as
they are (a template change that moves an edited line fails here, not on the GPU), the copy
leaves build folders behind, and unknown or ambiguous edits are refused."""

from __future__ import annotations

import os
import shutil

import pytest
from benchmark_scripts import BENCHMARKS, load

ROOT = os.path.dirname(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(load("template_ablation").VARIANTS))
def test_every_variant_applies_once_and_changes_its_files(name, tmp_path):
    ablation = load("template_ablation")
    templates = tmp_path / "kernel_templates"
    original = os.path.join(ROOT, "kernel_templates")
    shutil.copytree(original, templates)
    ablation.apply(str(templates), name)
    # A variant's edits of one file apply in turn.
    expected = {}
    for edit in ablation.VARIANTS[name].edits:
        if edit.file not in expected:
            with open(os.path.join(original, edit.file)) as f:
                expected[edit.file] = f.read()
        edited = expected[edit.file].replace(edit.old, edit.new)
        assert edited != expected[edit.file]
        expected[edit.file] = edited
    for file, text in expected.items():
        assert (templates / file).read_text() == text


def test_the_copy_skips_builds_and_the_variant_edits_only_the_copy(tmp_path):
    ablation = load("template_ablation")
    src = tmp_path / "src"
    (src / "kernel_templates").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "kernel_templates", "sm90_mlp_bwd.cuh"),
                src / "kernel_templates")
    (src / "build-gpu").mkdir()
    (src / "build-gpu" / "big.o").write_text("x")
    (src / ".git").mkdir()
    (src / ".ci").mkdir()
    (src / ".ci" / "build.sh").write_text("# a file, kept")
    dst = tmp_path / "dst"
    assert ablation.main([str(src), str(dst), "fc2-dgrad-nostore"]) == 0
    assert not (dst / "build-gpu").exists() and not (dst / ".git").exists()
    assert (dst / ".ci" / "build.sh").exists()
    assert "pr == -1234.5f" in (dst / "kernel_templates" / "sm90_mlp_bwd.cuh").read_text()
    assert "pr == -1234.5f" not in (src / "kernel_templates" / "sm90_mlp_bwd.cuh").read_text()


def test_unknown_variants_and_moved_text_are_refused(tmp_path, capsys):
    ablation = load("template_ablation")
    with pytest.raises(SystemExit):
        ablation.main([str(tmp_path), str(tmp_path / "d"), "nosuch"])
    templates = tmp_path / "kernel_templates"
    templates.mkdir()
    (templates / "sm90_mlp_bwd.cuh").write_text("// the edited line is gone\n")
    with pytest.raises(SystemExit, match="found it 0 times"):
        ablation.apply(str(templates), "fc2-dgrad-nostore")
    assert ablation.main(["--list"]) == 0
    assert "fc2-dgrad-noepilogue" in capsys.readouterr().out
