"""capture --target-gguf against llama.cpp's own decode and against capture --target-model-dir.

The target is a random Qwen3-4B-shaped model (36 layers, hidden 2560, FFN 9728, 32:8 heads of 128,
vocabulary 151936, tied embedding; BF16 safetensors generated once into the cache), converted by
llama.cpp's convert_hf_to_gguf.py to F16 and quantized by llama-quantize to Q4_K_M. For each GGUF:

* llama-bench's token-generation test (``-p 0 -n N``: llama.cpp's own target-only decode, built in the
  cached build) gives its tokens per second; our GGUFTarget.greedy decodes N tokens after a prompt,
  same threads, in the same run: the ratio of time per generated token is the figure;
* ``dflash-convert capture --target-gguf`` and ``--target-model-dir`` (transformers, float32) on one
  prompt under /usr/bin/time: wall time and peak RSS.

    python bench/bench_capture.py [--threads 2] [--new-tokens 16] [--results bench/results-capture.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (str(REPO / "bench"), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_convert import stamp_matches, write_synthetic_safetensors  # noqa: E402

from fixtures.cache import cache_root  # noqa: E402
from fixtures.targets import make_target_dir  # noqa: E402
from fixtures.upstream import build_dir, llama_cpp_dir, llama_tool, run_upstream_convert  # noqa: E402

SHAPE = {"hidden_size": 2560, "num_hidden_layers": 36, "intermediate_size": 9728, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
         "max_position_embeddings": 40960}
VERSION = "1"
PROMPT = "The old lighthouse keeper climbed the narrow stairs every evening at dusk."
TAPS = "1,9,17,25,33"  # five taps, as Qwen3-4B's DFlash drafter reads


def qwen3_4b_tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """Every weight of the Qwen3-4B shape, with its kind for the generator."""
    h, f, v, d = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"], SHAPE["head_dim"]
    q, kv = SHAPE["num_attention_heads"] * d, SHAPE["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (v, h), "matrix"), ("model.norm.weight", (h,), "norm")]
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), "norm"), (p + "post_attention_layernorm.weight", (h,), "norm"),
                (p + "self_attn.q_proj.weight", (q, h), "matrix"), (p + "self_attn.k_proj.weight", (kv, h), "matrix"),
                (p + "self_attn.v_proj.weight", (kv, h), "matrix"), (p + "self_attn.o_proj.weight", (h, q), "matrix"),
                (p + "self_attn.q_norm.weight", (d,), "norm"), (p + "self_attn.k_norm.weight", (d,), "norm"),
                (p + "mlp.gate_proj.weight", (f, h), "matrix"), (p + "mlp.up_proj.weight", (f, h), "matrix"),
                (p + "mlp.down_proj.weight", (h, f), "matrix")]
    return out


def ensure_models(root: Path) -> tuple[Path, dict[str, Path]]:
    """(the target directory, {"F16": gguf, "Q4_K_M": gguf}), generated once."""
    tdir, stamp = root / "Qwen3-4B-random", root / "Qwen3-4B-random.json"
    want = {"version": VERSION, **SHAPE}
    ggufs = {"F16": root / "Qwen3-4B-random-F16.gguf", "Q4_K_M": root / "Qwen3-4B-random-Q4_K_M.gguf"}
    if stamp_matches(stamp, want) and all(p.is_file() for p in ggufs.values()):
        return tdir, ggufs
    print("generating the Qwen3-4B-shaped target (8 GB of BF16, then its GGUFs) once ...", flush=True)
    shutil.rmtree(tdir, ignore_errors=True)
    make_target_dir(tdir, "qwen3", **SHAPE)
    write_synthetic_safetensors(tdir / "model.safetensors", qwen3_4b_tensors(), seed=4)
    r = run_upstream_convert(tdir, ggufs["F16"], outtype="f16")
    if r.returncode:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")
    subprocess.run([str(llama_tool("llama-quantize")), str(ggufs["F16"]), str(ggufs["Q4_K_M"]), "Q4_K_M", "2"],
                   check=True, capture_output=True)
    stamp.write_text(json.dumps(want) + "\n")
    return tdir, ggufs


def llama_bench() -> Path:
    """llama.cpp's tools/llama-bench, built into the cached build directory."""
    exe = build_dir() / "bin" / "llama-bench"
    if not exe.is_file():
        llama_tool("llama-quantize")
        llama_cpp_dir()
        subprocess.run(["cmake", "--build", str(build_dir()), "-j", str(os.cpu_count() or 2), "--target", "llama-bench"],
                       check=True, capture_output=True)
    return exe


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(wall s, peak RSS MB, stderr) of ``cmd`` under /usr/bin/time."""
    r = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *cmd], capture_output=True, text=True, env=env)
    m = re.findall(r"TIME ([0-9.]+) (\d+)", r.stderr)
    if r.returncode or not m:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return float(m[-1][0]), int(m[-1][1]) // 1024, r.stderr


def our_decode(gguf: Path, n: int, threads: int, env: dict[str, str]) -> float:
    """Seconds per generated token of GGUFTarget.greedy after the prompt's decode."""
    code = (f"import sys,time; sys.path.insert(0,{str(REPO)!r})\n"
            "from dflash_convert.runtime.libllama import load_libllama\n"
            "from dflash_convert.runtime.gguf_target import GGUFTarget, inspect_gguf_target\n"
            f"t=GGUFTarget(load_libllama(), inspect_gguf_target({str(gguf)!r}), n_ctx=256, threads={threads}, n_gpu_layers=0)\n"
            f"p=t.tokenize({PROMPT!r}); t.greedy(p, 1); t0=time.perf_counter(); s=t.greedy(p, {n + 1})\n"
            "t1=time.perf_counter(); t.greedy(p, 1); t2=time.perf_counter()\n"
            "print('PERTOKEN', ((t1-t0)-(t2-t1))/(len(s)-len(p)-1))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    m = re.search(r"PERTOKEN ([0-9.e-]+)", r.stdout)
    if r.returncode or not m:
        raise SystemExit(f"our decode failed:\n{r.stderr[-3000:]}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    """Run the bench and print (and write) the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--skip-directory", action="store_true", help="Leave out capture --target-model-dir (16 GB).")
    ap.add_argument("--results", type=Path)
    a = ap.parse_args(argv)
    root = cache_root() / "bench-capture"
    root.mkdir(parents=True, exist_ok=True)
    tdir, ggufs = ensure_models(root)
    bench = llama_bench()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DFLASH_CONVERT_LIBLLAMA": str(build_dir() / "bin" / "libllama.so")}
    prompts = root / "prompt.txt"
    prompts.write_text(PROMPT + "\n")
    n_gen = a.new_tokens + 33  # what capture decodes: -n N verifies N + 1, and a last block of up to 32 more
    speed, cap = [], []
    for name, gguf in ggufs.items():
        r = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", str(bench), "-m", str(gguf), "-p", "0", "-n", str(n_gen),
                            "-t", str(a.threads), "-ngl", "0", "-r", "2", "-o", "json"], capture_output=True, text=True, check=True)
        theirs = 1 / json.loads(r.stdout)[0]["avg_ts"]
        # llama.cpp's own peak RSS for the model: what capture's is judged against
        cap.append((f"llama-bench tg{n_gen} {name} (llama.cpp alone, 2 repetitions)",
                    *(lambda m: (float(m[-1][0]), int(m[-1][1]) // 1024))(re.findall(r"TIME ([0-9.]+) (\d+)", r.stderr))))
        ours = our_decode(gguf, n_gen, a.threads, env)
        speed.append((name, ours * 1e3, theirs * 1e3, ours / theirs))
        out = root / f"features-{name}.safetensors"
        t0 = time.time()
        wall, rss, _ = timed([sys.executable, "-m", "dflash_convert.cli", "capture", "--target-gguf", str(gguf), "--prompts",
                              str(prompts), "-o", str(out), "--new-tokens", str(a.new_tokens), "--layers", TAPS,
                              "--threads", str(a.threads), "--force", "-q"], env)
        cap.append((f"--target-gguf {name} ({gguf.stat().st_size / 1e9:.2f} GB)", wall, rss))
        print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
    if not a.skip_directory:
        out = root / "features-dir.safetensors"
        wall, rss, _ = timed([sys.executable, "-m", "dflash_convert.cli", "capture", "--target-model-dir", str(tdir),
                              "--prompts", str(prompts), "-o", str(out), "--new-tokens", str(a.new_tokens), "--layers",
                              TAPS, "--device", "cpu", "--force", "-q"], {**env, "OMP_NUM_THREADS": str(a.threads)})
        cap.append(("--target-model-dir (BF16 safetensors, run in float32)", wall, rss))
    lines = [f"Qwen3-4B-shaped random target, one prompt, --new-tokens {a.new_tokens} ({n_gen} decoded), "
             f"{a.threads} threads, taps {TAPS}.", "",
             "| GGUF | ours ms/token (GGUFTarget.greedy) | llama-bench tg ms/token | ratio (goal <= 1.3) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {n} | {o:.1f} | {t:.1f} | {r:.2f} |" for n, o, t, r in speed]
    lines += ["", "| capture | wall s | peak RSS MB |", "|---|---:|---:|"]
    lines += [f"| {n} | {w:.1f} | {r} |" for n, w, r in cap]
    text = "\n".join(lines)
    print(text)
    if a.results:
        a.results.write_text("# capture: bench/bench_capture.py\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
