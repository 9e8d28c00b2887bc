"""Hugging Face repo ids as inputs (``org/name[@revision]``), resolved from a real cache layout on disk.

Every test runs with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` pointing at a cache built in tmp
(blobs, snapshots of links into them, refs): huggingface_hub's own offline lookup resolves it, and
nothing reaches a network. What is proved: a conversion from repo ids equals the one from the
directories but for the four general.*.hf_* keys, which carry the snapshots' commits and sit right
after the other provenance keys; ``@tag``, ``@branch`` and ``@<sha>`` resolve; a missing repo, a
revision the cache lacks, an index naming a shard whose blob is gone, a target without a tokenizer
are each one error line naming the repo and revision, with no output; so is a repo the cache lacks
when the download is refused (huggingface_hub's own offline switch stops it before any connection);
an existing directory always wins over a repo id; no output goes into the cache; check's
``--checkpoint`` and ``--target-model-dir`` resolve too. A hostile cache stays one line, exit 2: a
revision that is no ref name (``../../../x``), a ref holding a path or linking out of refs/, a
snapshot or a file in it linking out of the repo's folder; a ref naming a commit the cache lacks
says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from gguf_compare import differences
from safetensors.torch import save_file

from dflash_convert import convert
from dflash_convert.errors import RepoError
from dflash_convert.format.keys import KEYS, is_provenance_key
from dflash_convert.sources.gguf import read_gguf
from dflash_convert.sources.hub import ALLOW_PATTERNS, DRAFTER, TARGET, resolve_source
from fixtures.drafters import make_zlab_drafter
from fixtures.hub_cache import add_snapshot, drop_blob, repo_folder

HF_KEYS = [KEYS[k][0] for k in ("source_hf_repo", "source_hf_commit", "target_hf_repo", "target_hf_commit")]


@pytest.fixture(scope="module")
def hub(tmp_path_factory, qwen3_target):
    """A cache holding org/drafter (main), org/target (main and tag v1, plus a second commit on branch dev)."""
    root = tmp_path_factory.mktemp("hub")
    drafter = make_zlab_drafter(root / "dirs" / "drafter", target_layer_ids=[0, 2])
    target = root / "dirs" / "target"
    shutil.copytree(qwen3_target, target)
    cache = root / "cache"
    commits = {
        "drafter": add_snapshot(cache, "org/drafter", drafter),
        "target": add_snapshot(cache, "org/target", target, refs=("main", "v1")),
        "target-dev": add_snapshot(cache, "org/target", target, refs=("dev",), salt="dev"),
    }
    return {"root": root, "cache": cache, "drafter": drafter, "target": target, "commits": commits}


@pytest.fixture
def offline(hub, tmp_path, monkeypatch):
    """The hub offline, the cache in tmp, and a fresh current directory (where a repo id's output goes)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _general(path: Path) -> dict:
    g = read_gguf(path)
    return {k: g.get(k) for k in g.metadata}


def _one_error_line(r, *needles: str, code: int = 2) -> str:
    """One ``dflash-convert: error:`` line holding every needle; exit 2 (an input cannot be read) unless told."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-convert: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_convert_from_repo_ids_equals_the_directories_but_for_the_hf_keys(hub, offline):
    from_dirs = offline / "from-dirs.gguf"
    convert(hub["drafter"], hub["target"], outfile=from_dirs, outtype="bf16")
    r = run_cli("convert", "org/drafter", "--target-model-dir", "org/target@v1", "--outtype", "bf16", "-q")
    assert r.returncode == 0, r.stderr
    from_hub = offline / "dflash-Drafter-BF16.gguf"  # the repo's name, in the current directory
    assert sorted(p.name for p in offline.iterdir()) == ["dflash-Drafter-BF16.gguf", "from-dirs.gguf"]
    assert not list(hub["cache"].rglob("*.gguf"))  # nothing written into the cache

    assert differences(from_hub, from_dirs) == []  # every non-general key and every tensor
    ours, theirs = _general(from_hub), _general(from_dirs)
    assert {k: v for k, v in ours.items() if k not in HF_KEYS} == theirs  # general.name too: the repo's name
    assert [ours[k] for k in HF_KEYS] == ["org/drafter", hub["commits"]["drafter"], "org/target", hub["commits"]["target"]]
    names = list(ours)
    last_provenance = max(i for i, k in enumerate(names) if is_provenance_key(k) and k not in HF_KEYS)
    assert names[last_provenance + 1:last_provenance + 5] == HF_KEYS
    assert not any(k in theirs for k in HF_KEYS)  # a directory input writes none


def test_a_branch_and_a_commit_sha_resolve_to_their_snapshots(hub, offline):
    dev = hub["commits"]["target-dev"]
    for spec, commit in ((f"org/target@{dev}", dev), ("org/target@dev", dev), ("org/target", hub["commits"]["target"])):
        got = resolve_source(spec, TARGET)
        assert (got.repo_id, got.commit) == ("org/target", commit)
        assert got.path == repo_folder(hub["cache"], "org/target") / "snapshots" / commit
    sha = hub["commits"]["drafter"]
    r = run_cli("convert", f"org/drafter@{sha}", "--target-model-dir", f"org/target@{dev}", "-o", offline / "x.gguf", "-q")
    assert r.returncode == 0, r.stderr
    f = _general(offline / "x.gguf")
    assert (f[HF_KEYS[1]], f[HF_KEYS[3]]) == (sha, dev)


def test_an_existing_directory_wins_over_a_repo_id(hub, offline):
    local = offline / "org" / "target"
    shutil.copytree(hub["target"], local)
    got = resolve_source("org/target", TARGET)
    assert (got.path, got.repo_id, got.commit) == (Path("org/target"), None, None)
    assert resolve_source("no-slash-name", TARGET).repo_id is None  # not a repo id: the reader's usual message


def test_a_missing_repo_is_one_line(hub, offline):
    r = run_cli("convert", "org/nothing", "--target-model-dir", "org/target")
    _one_error_line(r, "org/nothing@main", "not in the Hugging Face cache", "HF_HUB_OFFLINE=1")
    assert list(offline.iterdir()) == []


def test_a_revision_not_in_the_cache_offline_is_one_line(hub, offline):
    r = run_cli("convert", "org/drafter", "--target-model-dir", "org/target@v9")
    line = _one_error_line(r, "org/target@v9", "'v9' is not in the Hugging Face cache", "HF_HUB_OFFLINE=1")
    assert "dev, main, v1" in line  # what the cache does hold
    assert list(offline.iterdir()) == []


def test_an_index_naming_a_shard_whose_blob_is_gone_is_one_line(hub, offline):
    sharded = make_zlab_drafter(hub["root"] / "dirs" / "sharded", shards=2, target_layer_ids=[0, 2])
    commit = add_snapshot(hub["cache"], "org/sharded", sharded)
    drop_blob(hub["cache"], "org/sharded", commit, "model-00002-of-00002.safetensors")
    r = run_cli("convert", "org/sharded", "--target-model-dir", "org/target")
    _one_error_line(r, "org/sharded@main", f"snapshot {commit} is incomplete", "'model-00002-of-00002.safetensors'")
    assert list(offline.iterdir()) == []


def test_a_target_snapshot_without_a_tokenizer_is_one_line(hub, offline):
    add_snapshot(hub["cache"], "org/no-tokenizer", hub["target"], skip=("tokenizer.json", "tokenizer_config.json"))
    r = run_cli("convert", "org/drafter", "--target-model-dir", "org/no-tokenizer")
    _one_error_line(r, "org/no-tokenizer@main", "incomplete: no tokenizer")
    assert list(offline.iterdir()) == []


def test_a_snapshot_its_listing_calls_incomplete_is_judged_by_what_the_command_reads(hub, offline):
    """huggingface_hub's tree listing names a README the snapshot lacks: offline, convert still has what it
    reads; a tokenizer missing from a listed snapshot is named as such, not as an uncached revision."""
    readme = hub["root"] / "dirs" / "with-readme"
    if not readme.exists():
        shutil.copytree(hub["drafter"], readme)
        (readme / "README.md").write_text("# a drafter\n")
    commit = add_snapshot(hub["cache"], "org/drafter-no-readme", readme, listing=True, skip=("README.md",))
    assert (repo_folder(hub["cache"], "org/drafter-no-readme") / "trees" / f"{commit}.json").is_file()
    r = run_cli("convert", "org/drafter-no-readme", "--target-model-dir", "org/target", "-q")
    assert r.returncode == 0, r.stderr
    (written,) = offline.glob("dflash-*-BF16.gguf")  # named by the repo (general.name as upstream derives it)
    assert _general(written)[HF_KEYS[1]] == commit
    add_snapshot(hub["cache"], "org/listed-no-tokenizer", hub["target"], listing=True, skip=("tokenizer.json",))
    r = run_cli("convert", "org/drafter", "--target-model-dir", "org/listed-no-tokenizer", "-o", offline / "y.gguf")
    _one_error_line(r, "org/listed-no-tokenizer@main", "incomplete: no tokenizer")
    assert not (offline / "y.gguf").exists()


def test_a_target_is_resolved_without_its_weights():
    """The target's allow-list names no weights (convert reads its config and tokenizer only)."""
    assert not [p for p in ALLOW_PATTERNS[TARGET] if p.endswith((".safetensors", ".bin", ".index.json"))]


def test_an_output_inside_the_cache_is_refused(hub, offline):
    inside = repo_folder(hub["cache"], "org/drafter") / "out.gguf"
    r = run_cli("convert", "org/drafter", "--target-model-dir", "org/target", "-o", inside)
    _one_error_line(r, "inside the Hugging Face cache", code=1)  # refused, like an output over an input
    assert not inside.exists()


def test_check_resolves_its_checkpoint_and_target(hub, offline):
    from dflash_convert.check import check  # imports torch: only this test pays for it

    weighted = hub["root"] / "dirs" / "target-weights"
    if not weighted.exists():
        shutil.copytree(hub["target"], weighted)
        cfg = json.loads((weighted / "config.json").read_text())
        emb = (torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=torch.Generator().manual_seed(7)) * 0.05)
        save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16)}, str(weighted / "model.safetensors"))
    add_snapshot(hub["cache"], "org/target-weights", weighted)
    gguf = offline / "f32.gguf"
    convert(hub["drafter"], weighted, outfile=gguf, outtype="f32")
    report = check(gguf, "org/drafter", target_model_dir="org/target-weights", device="cpu", context=7)
    assert report.exit_code == 0, report.render_text()
    assert report.checkpoint == str(repo_folder(hub["cache"], "org/drafter") / "snapshots" / hub["commits"]["drafter"])
    with pytest.raises(RepoError, match=r"^org/drafter@v2: revision 'v2' is not in the Hugging Face cache"):
        check(gguf, "org/drafter@v2", target_model_dir="org/target-weights", device="cpu", context=7)


def test_not_cached_and_the_hub_unreachable_is_one_line(hub, tmp_path):
    """Online by our reading of the environment, offline by huggingface_hub's (set at its import): the
    download is tried, refused by huggingface_hub before any connection, and reported as one line."""
    script = ("import os, huggingface_hub\n"
              "del os.environ['HF_HUB_OFFLINE']\n"
              "from dflash_convert.sources.hub import resolve_source\n"
              "from dflash_convert.errors import RepoError\n"
              "try:\n    resolve_source('org/nothing@v3', 'drafter')\n"
              "except RepoError as e:\n    print(e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub["cache"])}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"org/nothing@v3: no such directory, and not in the Hugging Face cache at {hub['cache']}, "
                                "and the Hub cannot be reached")


# --- the cache is untrusted: nothing is read from outside a repo's own folder -------------------------------


def _elsewhere_snapshot(hub, salt: str) -> tuple[Path, str]:
    """A complete drafter snapshot outside the cache (another cache beside it), and its commit."""
    other = hub["root"] / f"elsewhere-{salt}"
    commit = add_snapshot(other, "x/y", hub["drafter"], salt=salt)
    return repo_folder(other, "x/y") / "snapshots" / commit, commit


def test_a_ref_holding_a_path_is_one_line(hub, offline):
    """refs/main holding ``../../../elsewhere-…/<sha>`` once led huggingface_hub to a snapshot outside the
    cache, converted with this repo's name in the hf keys; a ref must hold a commit."""
    _, commit = _elsewhere_snapshot(hub, "ref-path")
    add_snapshot(hub["cache"], "org/ref-path", hub["drafter"], salt="ref-path")
    escape = f"../../../elsewhere-ref-path/models--x--y/snapshots/{commit}"
    assert (repo_folder(hub["cache"], "org/ref-path") / "snapshots" / escape).is_dir()  # what it once reached
    (repo_folder(hub["cache"], "org/ref-path") / "refs" / "main").write_text(escape)
    r = run_cli("convert", "org/ref-path", "--target-model-dir", "org/target", "-o", offline / "x.gguf")
    _one_error_line(r, "org/ref-path@main", "refs/main does not hold a commit (40 hex digits)")
    assert list(offline.iterdir()) == []


@pytest.mark.parametrize("revision", ["../../../outside-ref", "/abs/outside-ref", "main/../../../../outside-ref",
                                      "a//b", ".hidden", "main.lock", "a\\b", "a b", "x@{1}"])
def test_a_revision_that_is_no_ref_name_is_refused(hub, offline, revision):
    """A revision names a file under refs/ to huggingface_hub: a path that leaves it (``../`` to a file
    holding a real commit, planted here) is refused before any file is opened."""
    (hub["root"] / "outside-ref").write_text(hub["commits"]["drafter"])
    with pytest.raises(RepoError, match="the revision is not a branch, tag or commit name"):
        resolve_source(f"org/drafter@{revision}", DRAFTER)


def test_a_revision_refused_on_the_command_line_is_one_line(hub, offline):
    (hub["root"] / "outside-ref").write_text(hub["commits"]["drafter"])
    r = run_cli("convert", "org/drafter@../../../outside-ref", "--target-model-dir", "org/target", "-o", offline / "x.gguf")
    _one_error_line(r, "org/drafter@../../../outside-ref: the revision is not a branch, tag or commit name")
    assert list(offline.iterdir()) == []


def test_a_hub_pull_request_ref_resolves(hub, offline):
    """The Hub's own ref names hold a '/' (refs/pr/1): a ref name, not a path, so it resolves."""
    commit = add_snapshot(hub["cache"], "org/with-pr", hub["drafter"], refs=("main", "refs/pr/1"), salt="pr")
    got = resolve_source("org/with-pr@refs/pr/1", DRAFTER)
    assert (got.repo_id, got.commit) == ("org/with-pr", commit)


def test_a_ref_linking_outside_refs_is_refused(hub, offline):
    """refs/main a symbolic link to a file outside the repo's refs/, holding a real commit."""
    add_snapshot(hub["cache"], "org/ref-link", hub["drafter"], salt="ref-link")
    planted = hub["root"] / "planted-ref"
    planted.write_text(hub["commits"]["drafter"])
    ref = repo_folder(hub["cache"], "org/ref-link") / "refs" / "main"
    ref.unlink()
    ref.symlink_to(planted)
    with pytest.raises(RepoError, match=r"^org/ref-link@main: the cache's ref .*refs/main leads outside"):
        resolve_source("org/ref-link", DRAFTER)


def test_a_snapshot_linking_outside_its_repo_is_refused(hub, offline):
    """A snapshot folder that is a link to one outside the cache, and a snapshot whose weights link to a
    file outside the repo's folder (another repo's blobs included): the provenance keys would lie."""
    elsewhere, _ = _elsewhere_snapshot(hub, "snap-link")
    commit = add_snapshot(hub["cache"], "org/snap-link", hub["drafter"], salt="snap-link")
    snapshot = repo_folder(hub["cache"], "org/snap-link") / "snapshots" / commit
    shutil.rmtree(snapshot)
    snapshot.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(RepoError, match=r"^org/snap-link@main: the cache's snapshot .* leads outside .*snapshots"):
        resolve_source("org/snap-link", DRAFTER)

    commit = add_snapshot(hub["cache"], "org/file-link", hub["drafter"], salt="file-link")
    weights = repo_folder(hub["cache"], "org/file-link") / "snapshots" / commit / "model.safetensors"
    weights.unlink()
    weights.symlink_to(hub["drafter"] / "model.safetensors")
    r = run_cli("convert", "org/file-link", "--target-model-dir", "org/target", "-o", offline / "x.gguf")
    _one_error_line(r, "org/file-link@main", "model.safetensors in the cache's snapshot leads outside")
    assert list(offline.iterdir()) == []


def test_a_ref_to_a_commit_the_cache_lacks_names_the_commit(hub, offline):
    """refs/main names a commit whose snapshot folder is not there: said so (not 'main is not in the
    cache, it holds main')."""
    add_snapshot(hub["cache"], "org/ref-gone", hub["drafter"], salt="ref-gone")
    (repo_folder(hub["cache"], "org/ref-gone") / "refs" / "main").write_text("0" * 40)
    r = run_cli("convert", "org/ref-gone", "--target-model-dir", "org/target", "-o", offline / "x.gguf")
    line = _one_error_line(r, "org/ref-gone@main: the cache's ref 'main' names commit " + "0" * 40,
                           "whose snapshot is not in the cache")
    assert "it holds" not in line
