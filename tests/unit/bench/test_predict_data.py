"""`fleettune bench predict`'s loaders: each data kind read into rows, from small files written
here, and the real tables of the shared workspace when it has them."""

from __future__ import annotations

import gzip
import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest

from fleettune_dev.bench.predict.data import KINDS, load
from fleettune_dev.bench.predict.rows import config_key

PREDICTION = Path(os.environ.get("FLEETTUNE_SHARED_DATA") or Path(__file__).resolve().parents[4] / "shared" / "data")
PREDICTION = PREDICTION / "prediction"


def _kt_cache(device: str, size: list[int], entries: dict[tuple[int, int], float | str]) -> dict:
    cache = {}
    for (bx, tile), t in entries.items():
        entry = {"block_size_x": bx, "tile_size": tile, "time": t, "compile_time": 100.0}
        if not isinstance(t, str):
            entry["times"] = [t, t]
        cache[f"{bx},{tile}"] = entry
    return {"device_name": device, "kernel_name": "k", "problem_size": size,
            "tune_params_keys": ["block_size_x", "tile_size"],
            "tune_params": {"block_size_x": [32, 64, 128], "tile_size": [1, 2]}, "objective": "time", "cache": cache}


def test_kt_caches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = _kt_cache("NVIDIA GeForce RTX 3090", [4096, 1024],
                  {(32, 1): 3.0, (64, 1): 1.5, (64, 2): "CompilationFailedConfig", (128, 2): 2.0})
    (tmp_path / "gemm-RTX_3090.json").write_text(json.dumps(a))
    b = _kt_cache("", [100], {(64, 1): 1.0, (128, 1): 0.5})  # no default (32, 1); no device name
    with gzip.open(tmp_path / "gemm-MI250X.json.gz", "wt") as fh:
        json.dump(b, fh)
    (tmp_path / "gemm-T4.json").write_text(json.dumps({"results": [], "schema_version": "1.0.0"}))
    with caplog.at_level(logging.WARNING):
        rows = load(f"kt-caches:{tmp_path}")
    assert "gemm-T4.json" in caplog.text
    by_device = {r.device: r for r in rows}
    assert sorted(by_device) == ["MI250X", "NVIDIA GeForce RTX 3090"]
    r = by_device["NVIDIA GeForce RTX 3090"]
    assert r.data == f"kt-caches:{tmp_path.name}" and r.kind == "kt-caches"
    assert (r.group, r.family, r.key) == ("gemm", "gemm", "gemm|NVIDIA GeForce RTX 3090|4096x1024")
    assert r.volume == 4096 * 1024
    assert r.problem == {"size_0": 4096, "size_1": 1024, "device": "NVIDIA GeForce RTX 3090"}
    assert r.best == {"block_size_x": 64, "tile_size": 1}
    assert r.times is not None and set(r.times) == {config_key({"block_size_x": b, "tile_size": t})
                                                    for b, t in [(32, 1), (64, 1), (128, 2)]}
    assert r.times[config_key({"tile_size": 2, "block_size_x": 128})] == 2.0
    assert r.invalid == {config_key({"block_size_x": 64, "tile_size": 2})}
    assert r.default == {"block_size_x": 32, "tile_size": 1}
    m = by_device["MI250X"]
    assert m.best == {"block_size_x": 128, "tile_size": 1} and m.default is None and m.volume == 100


def _table(tmp_path: Path, sub: str, name: str, table: dict) -> None:
    (tmp_path / sub).mkdir(exist_ok=True)
    (tmp_path / sub / name).write_text(json.dumps(table))


def test_vllm_tables(tmp_path: Path) -> None:
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3}
    _table(tmp_path, "fused_moe", "E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3.json",
           {"64": {**cfg, "BLOCK_SIZE_M": 64}, "1": cfg, "8": cfg})
    _table(tmp_path, "w8a8_block_fp8", "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,"
           "block_shape=[128, 128].json", {"2": {**cfg, "num_ctas": 1}})
    rows = load(f"vllm-tables:{tmp_path}")
    assert len(rows) == 4
    moe = [r for r in rows if r.problem["kernel"] == "fused_moe"]
    assert [r.problem["M"] for r in moe] == [1, 8, 64] and [r.volume for r in moe] == [1, 8, 64]
    r = moe[2]
    assert r.group == r.device == "NVIDIA_H100_80GB_HBM3"
    assert r.family == "fused_moe:E=8,N=3584"
    assert r.key == "E=8,N=3584,device_name=NVIDIA_H100_80GB_HBM3|M=64"
    assert r.problem == {"M": 64, "E": 8, "N": 3584, "dtype": "auto", "block_shape": "none", "kernel": "fused_moe",
                         "device": "NVIDIA_H100_80GB_HBM3"}
    assert r.best["BLOCK_SIZE_M"] == 64 and r.times is None
    (fp8,) = [r for r in rows if r.problem["kernel"] == "w8a8_block_fp8"]
    assert fp8.family == "w8a8_block_fp8:N=1536,K=7168,dtype=fp8_w8a8,block_shape=[128,128]"
    assert fp8.problem["block_shape"] == "[128,128]" and fp8.problem["K"] == 7168 and "E" not in fp8.problem
    assert fp8.best["num_ctas"] == 1


_CONFIG_COLUMNS = ["layout", "data_type", "direction", "spatial_dim", "in_channels", "in_h", "in_w", "in_d", "fil_h",
                   "fil_w", "fil_d", "out_channels", "batchsize", "pad_h", "pad_w", "pad_d", "conv_stride_h",
                   "conv_stride_w", "conv_stride_d", "dilation_h", "dilation_w", "dilation_d", "bias", "group_count"]


def _perfdb(path: Path, entries: list[tuple[str, str, int]]) -> None:
    """A perf-db with MIOpen's schema; each entry is (solver, params, batch size) on one 3x3 problem."""
    db = sqlite3.connect(path)
    cols = ",".join(f"`{c}` {'TEXT' if c in ('layout', 'data_type', 'direction') else 'INT'} NOT NULL"
                    for c in _CONFIG_COLUMNS)
    db.execute(f"CREATE TABLE `config` (`id` INTEGER PRIMARY KEY ASC,{cols})")
    db.execute("CREATE TABLE `perf_db` (`id` INTEGER PRIMARY KEY ASC,`solver` TEXT NOT NULL,"
               "`config` INTEGER NOT NULL, `params` TEXT NOT NULL)")
    for solver, params, batch in entries:
        values = ["NCHW", "FP32", "F", 2, 64, 28, 28, 1, 3, 3, 1, 128, batch, 1, 1, 0, 1, 1, 0, 1, 1, 0, 0, 1]
        row = db.execute(f"select id from config where batchsize = {batch}").fetchone()
        if row is None:
            cid = db.execute(f"insert into config ({','.join(_CONFIG_COLUMNS)}) values "
                             f"({','.join('?' * len(values))})", values).lastrowid
        else:
            cid = row[0]
        db.execute("insert into perf_db (solver, config, params) values (?, ?, ?)", (solver, cid, params))
    db.commit()
    db.close()


def test_miopen_perfdb(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raw = tmp_path / "raw.db"
    _perfdb(raw, [("ConvAsm3x3U", "7,8,4", 16), ("ConvAsm3x3U", "5,6,7", 128), ("ConvAsm3x3U", "1,2", 256),
                  ("ConvAsm3x3U", "5,x,7", 256), ("ConvMlirIgemmFwd", "256,128,64,8,4,2", 16)])
    gz = tmp_path / "gfx906_60.db.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    with caplog.at_level(logging.WARNING):
        rows = load(f"miopen-perfdb:{gz}")
    assert "dropped 1 of 5" in caplog.text  # "1,2": two fields where the solver's others have three
    assert load(f"miopen-perfdb:{raw}")[0].device == "raw"  # uncompressed reads too
    assert [(r.group, r.problem["batchsize"]) for r in rows] == [
        ("ConvAsm3x3U", 16), ("ConvAsm3x3U", 128), ("ConvAsm3x3U", 256), ("ConvMlirIgemmFwd", 16)]
    r = rows[2]
    assert r.best == {"p0": 5, "p1": "x", "p2": 7}
    assert r.device == "gfx906_60" and r.data == "miopen-perfdb:gfx906_60.db.gz"
    assert r.volume == 256 * 64 * 28 * 28 * 128 * 3 * 3
    assert r.problem["layout"] == "NCHW" and r.problem["in_channels"] == 64 and r.problem["device"] == "gfx906_60"
    assert "id" not in r.problem and set(r.problem) == {*_CONFIG_COLUMNS, "device"}
    assert len({x.family for x in rows}) == 1  # the batch size is not part of the family
    assert len({x.key for x in rows}) == 4 and r.key.startswith("ConvAsm3x3U|NCHW-FP32-F-2-64-28-28-")


FINDDB = """\
64-28-28-3x3-128-28-28-16-1x1-1x1-1x1-0-NCHW-FP32-F=miopenConvolutionFwdAlgoImplicitGEMM:ConvMlirIgemmFwd,0.4,0,\
miopenConvolutionFwdAlgoImplicitGEMM,<unused>;miopenConvolutionFwdAlgoWinograd:ConvBinWinogradRxSf2x3,0.25,0,\
miopenConvolutionFwdAlgoWinograd,<unused>;miopenConvolutionFwdAlgoDirect:ConvMlirIgemmFwd,0.5,0,x,<unused>
64-28-28-3x3-128-28-28-32-1x1-2x2-1x1-0-NHWC-NHWC-NHWC-FP16-B_g32=miopenConvolutionBwdDataAlgoGEMM:GemmBwdRest,2.0,4096,\
miopenConvolutionBwdDataAlgoGEMM,<unused>
16-4-14-14-1x3x3-32-4-14-14-8-0x1x1-1x1x1-1x1x1-0-NCDHW-FP32-W=miopenConvolutionBwdWeightsAlgoDirect:ConvDirectNaiveConvWrw,9.5,0,\
miopenConvolutionBwdWeightsAlgoDirect,<unused>
this is not a find-db line
"""


def test_miopen_finddb(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gfx906_60.HIP.fdb.txt"
    path.write_text(FINDDB)
    with caplog.at_level(logging.WARNING):
        rows = load(f"miopen-finddb:{path}")
    assert "skipped 1 lines" in caplog.text
    assert len(rows) == 3 and {r.device for r in rows} == {"gfx906_60"}
    fwd, bwd, wrw = rows
    assert fwd.group == "F" and fwd.best == {"solver": "ConvBinWinogradRxSf2x3"}
    assert fwd.times == {config_key({"solver": "ConvBinWinogradRxSf2x3"}): 0.25,
                         config_key({"solver": "ConvMlirIgemmFwd"}): 0.4}  # the faster of a repeated solver
    assert fwd.key == "64-28-28-3x3-128-28-28-16-1x1-1x1-1x1-0-NCHW-FP32-F"
    assert fwd.family == "64-28-28-3x3-128-28-28-1x1-1x1-1x1-0-NCHW-FP32-F"
    assert fwd.volume == 16 * 64 * 28 * 28 * 128 * 3 * 3
    p = fwd.problem
    assert (p["in_channels"], p["in_h"], p["in_w"], p["fil_h"], p["fil_w"]) == (64, 28, 28, 3, 3)
    assert (p["out_channels"], p["out_h"], p["out_w"]) == (128, 28, 28)
    assert (p["batchsize"], p["pad_h"], p["conv_stride_w"], p["dilation_h"], p["bias"]) == (16, 1, 1, 1, 0)
    assert (p["layout"], p["data_type"], p["direction"]) == ("NCHW", "FP32", "F")
    assert (p["group_count"], p["spatial_dim"]) == (1, 2)
    assert (p["in_d"], p["fil_d"], p["device"]) == (1, 1, "gfx906_60")
    assert bwd.group == "B" and bwd.problem["group_count"] == 32 and bwd.problem["layout"] == "NHWC"
    assert bwd.problem["conv_stride_h"] == 2 and bwd.problem["data_type"] == "FP16"
    assert bwd.family == "64-28-28-3x3-128-28-28-1x1-2x2-1x1-0-NHWC-NHWC-NHWC-FP16-B_g32"
    assert wrw.problem["spatial_dim"] == 3 and wrw.problem["in_d"] == 4 and wrw.problem["fil_d"] == 1
    assert wrw.problem["batchsize"] == 8 and wrw.problem["pad_d"] == 0 and wrw.problem["pad_h"] == 1
    assert wrw.volume == 8 * 16 * 4 * 14 * 14 * 32 * 3 * 3
    assert set(wrw.problem) == set(p)  # 2-D and 3-D keys describe a problem alike


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="KIND one of"):
        load(f"tables:{tmp_path}")
    with pytest.raises(ValueError, match="KIND one of"):
        load(str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        load(f"vllm-tables:{tmp_path / 'absent'}")
    bad = tmp_path / "gfx900.db"
    bad.write_bytes(b"not a database at all" * 10)
    with pytest.raises(ValueError, match="not a MIOpen perf-db"):
        load(f"miopen-perfdb:{bad}")
    (tmp_path / "broken.json").write_text('{"tune_params": {"x": []}}')
    with pytest.raises(ValueError, match=r"cannot read broken\.json"):
        load(f"kt-caches:{tmp_path / 'broken.json'}")
    (tmp_path / "t4.json").write_text('{"results": []}')
    with pytest.raises(ValueError, match="no Kernel Tuner cache"):
        load(f"kt-caches:{tmp_path / 't4.json'}")
    with pytest.raises(ValueError, match="no find-db line"):
        load(f"miopen-finddb:{tmp_path / 'broken.json'}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"no \*\.json file"):
        load(f"vllm-tables:{empty}")


REAL = [("miopen-perfdb", "miopen/gfx906_60.db.gz", 50_000), ("miopen-perfdb", "miopen/gfx900_56.db.gz", 20_000),
        ("miopen-finddb", "miopen/gfx906_60.HIP.fdb.txt.gz", 100_000), ("vllm-tables", "vllm", 1_500)]


@pytest.mark.parametrize(("kind", "name", "at_least"), REAL, ids=[n for _, n, _ in REAL])
def test_real_data(kind: str, name: str, at_least: int) -> None:
    assert kind in KINDS
    path = PREDICTION / name
    if not path.exists():
        pytest.skip(f"{path} is absent (the prediction data ships with the shared workspace, not the repo)")
    rows = load(f"{kind}:{path}")
    assert len(rows) > at_least
    assert len({r.key for r in rows}) == len(rows)
    assert all(r.best and r.volume > 0 and r.problem["device"] == r.device for r in rows)
    if kind == "vllm-tables":
        assert len({r.device for r in rows}) >= 5 and len({r.family for r in rows}) >= 50
    else:
        assert len({r.family for r in rows}) > 1_000
