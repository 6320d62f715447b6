"""The trnsim command."""

import json

from trnsim.cli import main


def test_chips_lists_the_three_chips_side_by_side(capsys):
    assert main(["chips"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["trn1", "trn2", "trn3"]
    assert "PE clock            2.8 GHz" in out and "2.4 GHz" in out
    assert "SBUF                24 MiB (128x192 KiB)" in out
    assert "HBM bandwidth       820 GB/s" in out and "2900 GB/s" in out and "4900 GB/s" in out


def test_chips_with_a_what_if_file(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "trn2"\n[chip]\nname = "mine"\n[hbm]\nbw_gbps = 6000\n')
    assert main(["chips", "--chip", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["trn1", "trn2", "trn3", "mine"]
    assert "6000 GB/s" in out


def test_bad_chip_is_a_clear_error(capsys):
    assert main(["demo", "--chip", "trn7", "--size", "128", "128", "512"]) == 2
    assert "trnsim: error: --chip 'trn7': unknown chip 'trn7'" in capsys.readouterr().err


def test_demo_and_report(tmp_path, capsys):
    path = tmp_path / "d.json"
    assert main(["demo", "--trace", str(path), "--size", "256", "256", "512", "--chip", "trn1"]) == 0
    out = capsys.readouterr().out
    assert "matches numpy" in out and "simulated time" in out and "on trn1" in out
    data = json.loads(path.read_text())
    threads = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"TensorE (matmul)", "TensorE (load stationary)", "VectorE"} <= threads
    assert any(t.startswith("DMA queue") for t in threads)
    assert main(["report", str(path), "--plot", str(tmp_path / "d.png")]) == 0
    assert "simulated time" in capsys.readouterr().out
    assert (tmp_path / "d.png").stat().st_size > 0


def test_llama_demo_trains_on_neuron_to_the_cpu_losses(tmp_path, capsys):
    path = tmp_path / "llama.json"
    assert main(["demo", "llama", "--steps", "2", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "on neuron, matching the CPU's (max relative difference 0.0e+00)" in out
    assert "train step" in out and "device busy" in out and "flash_attention_bwd" in out
    data = json.loads(path.read_text())
    assert any(e.get("name") == "_scaled_dot_product_fused_attention_overrideable" for e in data["traceEvents"])


def test_compile_demo_compares_eager_and_compiled(tmp_path, capsys):
    path = tmp_path / "compile.json"
    assert main(["demo", "compile", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "logits         compiled match eager" in out
    assert "one launch" in out and "fused_matmul_kernel" in out and "compilation    1 graph" in out
    data = json.loads(path.read_text())
    assert any(e.get("name", "").startswith("fused[") for e in data["traceEvents"])
