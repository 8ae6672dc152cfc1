"""``harnessrl.hardware``: bf16 only where the CPU computes it natively (AMX / AVX512-BF16)."""

from __future__ import annotations

from pathlib import Path

from harnessrl import hardware


def _cpuinfo(tmp_path: Path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: X\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
    return str(path)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path):
    a = tmp_path / "a"
    a.mkdir()
    assert hardware.cpu_has_native_bf16(_cpuinfo(a, "avx2 amx_bf16 amx_tile"))
    b = tmp_path / "b"
    b.mkdir()
    assert hardware.cpu_has_native_bf16(_cpuinfo(b, "avx512f avx512_bf16"))
    c = tmp_path / "c"
    c.mkdir()
    assert not hardware.cpu_has_native_bf16(_cpuinfo(c, "avx2 fma"))  # an AVX2 EPYC: bf16 is emulated
    assert not hardware.cpu_has_native_bf16(str(tmp_path / "missing"))


def test_auto_picks_bf16_only_where_it_is_native():
    def emulated() -> bool:
        return False

    def native() -> bool:
        return True

    assert (
        hardware.resolve_dtype("auto", "cpu", native_bf16=emulated) == "float32"
        and hardware.resolve_autocast("auto", False, native_bf16=emulated) == "none"
    )
    assert (
        hardware.resolve_dtype("auto", "cuda", native_bf16=emulated) == "bfloat16"
        and hardware.resolve_autocast("auto", True, native_bf16=emulated) == "bf16"
    )
    assert hardware.resolve_dtype("bfloat16", "cpu", native_bf16=emulated) == "bfloat16"  # kept as chosen
    assert (
        hardware.resolve_dtype("auto", "cpu", native_bf16=native) == "bfloat16"
        and hardware.resolve_autocast("auto", False, native_bf16=native) == "bf16"
    )
