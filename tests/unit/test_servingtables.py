"""The tables serving stacks load (`spec.publish.format: vllm`), read back as vLLM reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleettune.api import PublishSpec, VllmTableSpec
from fleettune.published import PublishedEntry, publish_plan, read_entries
from fleettune.servingtables import ITEMS_KEY, file_name, tables

MOE = VllmTableSpec(file_name="E=8,N={problem_size[1]},device_name={device}.json")
VLLM_TABLES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "prediction" / "vllm" / "fused_moe"


def entry(pool: str, m: int, block_m: int, time_ms: float = 1.0, device: str = "NVIDIA A100-SXM4-80GB",
          n: int = 14336) -> PublishedEntry:
    return PublishedEntry(pool=pool, problem_size=(m, n, 4096), config={"BLOCK_SIZE_M": block_m, "num_warps": 4},
                          time_ms=time_ms, device_name=device)


def vllm_config(folder: dict[str, str], e: int, n: int, torch_device_name: str, m: int) -> dict[str, Any] | None:
    """vLLM's lookup (fused_moe.get_config_file_name and get_moe_configs): the file named after
    the shape and the device (torch's name, spaces as underscores), its keys as ints, the
    nearest tuned M."""
    device_name = torch_device_name.replace(" ", "_")
    text = folder.get(f"E={e},N={n},device_name={device_name}.json")
    if text is None:
        return None
    table = json.loads(text)
    table.pop("triton_version", None)
    configs = {int(key): val for key, val in table.items()}
    return configs[min(configs.keys(), key=lambda x: abs(x - m))]


def mounted(data: dict[str, str]) -> dict[str, str]:
    """The folder a ConfigMap volume with the published items shows (file name -> text)."""
    return {item["path"]: data[item["key"]] for item in json.loads(data[ITEMS_KEY])}


def test_a_published_table_is_found_and_read_as_vllm_reads_it() -> None:
    best = [entry("a100", 1, 16), entry("a100", 64, 32), entry("a100", 1024, 128),
            entry("rtx", 64, 64, device="NVIDIA RTX A4000")]
    data = publish_plan("moe", None, best, vllm=MOE)
    assert data is not None
    folder = mounted(data)
    assert set(folder) == {"E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json",
                           "E=8,N=14336,device_name=NVIDIA_RTX_A4000.json"}
    # Keys a ConfigMap can hold; the tables beside tuned.json, which keeps every entry.
    assert all(set(k) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") for k in data)
    assert len(read_entries(data)) == 4
    # The nearest tuned M, as vLLM takes it.
    assert vllm_config(folder, 8, 14336, "NVIDIA A100-SXM4-80GB", 1)["BLOCK_SIZE_M"] == 16
    assert vllm_config(folder, 8, 14336, "NVIDIA A100-SXM4-80GB", 48)["BLOCK_SIZE_M"] == 32
    assert vllm_config(folder, 8, 14336, "NVIDIA A100-SXM4-80GB", 4096)["BLOCK_SIZE_M"] == 128
    assert vllm_config(folder, 8, 14336, "NVIDIA RTX A4000", 1)["BLOCK_SIZE_M"] == 64
    assert vllm_config(folder, 8, 4096, "NVIDIA A100-SXM4-80GB", 1) is None
    # Writing the same result again changes nothing.
    assert publish_plan("moe", data, best, vllm=MOE) is None


def test_two_pools_on_one_gpu_share_its_table_and_the_faster_wins() -> None:
    got = tables([entry("a", 16, 32, time_ms=2.0), entry("b", 16, 64, time_ms=1.0), entry("b", 8, 16)], MOE)
    (table,) = got.values()
    assert list(table) == ["8", "16"] and table["16"]["BLOCK_SIZE_M"] == 64


def test_entries_without_a_reported_device_or_batch_dimension_have_no_table() -> None:
    assert tables([entry("a", 16, 32, device="")], MOE) == {}
    assert tables([entry("a", 16, 32)], VllmTableSpec(batch_dimension=2, file_name="{device}.json")) != {}
    assert "vllm-items.json" not in (publish_plan("r", None, [entry("a", 16, 32, device="")], vllm=MOE) or {})
    with pytest.raises(ValueError, match="no dimension 2"):
        file_name("{problem_size[2]}.json", "X", (1, 2))


def test_the_format_is_opt_in_and_names_are_checked() -> None:
    assert PublishSpec(config_map_name="t").format == "fleettune"
    with pytest.raises(ValueError, match="file_name"):
        VllmTableSpec(file_name="tables/{device}.json")


@pytest.mark.skipif(not VLLM_TABLES.is_dir(), reason="the shared vLLM tables are not here")
def test_the_reader_reads_vllms_own_shipped_tables() -> None:
    """The lookup above is vLLM's: it reads the tables vLLM ships (../shared/data)."""
    path = next(VLLM_TABLES.glob("E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json"), None) or \
        next(VLLM_TABLES.glob("E=*,N=*,device_name=NVIDIA_A100-SXM4-80GB.json"))
    e, n = (int(part.split("=")[1]) for part in path.name.split(",")[:2])
    config = vllm_config({path.name: path.read_text()}, e, n, "NVIDIA A100-SXM4-80GB", 3)
    assert config is not None and {"BLOCK_SIZE_M", "num_warps"} <= config.keys()
