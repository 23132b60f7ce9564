"""When `screen` suggests --dtype bfloat16 (core.model.loading.bfloat16_hint): hand-made /proc/cpuinfo texts."""

from core.model.loading import bfloat16_hint, cpu_has_native_bfloat16

AMX = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n"
PLAIN = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\nbugs\t\t: avx512_bf16_is_not_a_flag_here\n"


def test_native_bfloat16_is_read_from_the_flags_line_only():
    assert cpu_has_native_bfloat16(AMX) and cpu_has_native_bfloat16(AVX512_BF16)
    assert not cpu_has_native_bfloat16(PLAIN) and not cpu_has_native_bfloat16("")


def test_the_hint_asks_for_float32_on_a_bf16_cpu_and_a_large_model():
    smollm2, gemma3, zoo = (270, 576), (72, 640), (36, 128)  # (heads, d_model)
    assert "--dtype bfloat16" in bfloat16_hint("float32", "cpu", *smollm2, cpuinfo=AMX)
    assert "--dtype bfloat16" in bfloat16_hint("float32", "cpu", *gemma3, cpuinfo=AVX512_BF16)
    assert bfloat16_hint("float32", "cpu", *zoo, cpuinfo=AMX) is None  # the zoo's models: nothing to gain
    assert bfloat16_hint("float32", "cpu", *smollm2, cpuinfo=PLAIN) is None  # no hardware bfloat16
    assert bfloat16_hint("bfloat16", "cpu", *smollm2, cpuinfo=AMX) is None  # already asked for
    assert bfloat16_hint("float32", "cuda:0", *smollm2, cpuinfo=AMX) is None  # a GPU: not this CPU's flags
