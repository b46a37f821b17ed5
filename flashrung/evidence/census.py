"""Ahead-of-time compile → resource and SASS census, with no GPU.

Every kernel module registers the configurations it ships as :class:`CensusSpec` objects
(``flashrung.kernels.registry``). The census compiles each for a target architecture with
Triton's own compiler and its bundled ``cuobjdump``, and reads back what the compiler made:
registers per thread, shared memory per block, spill (local) bytes and SASS instruction-family
counts. This is evidence level *SASS* (seed 001, 0x0F): it shows what instructions exist, not
how long they take.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any, Mapping

ARCHES = {
    # name → (capability, the shared-memory ceiling per block in bytes, opt-in)
    "sm_80": (80, 163 * 1024),
    "sm_90a": (90, 227 * 1024),
    "sm_120": (120, 99 * 1024),
}

# SASS families reported by name; everything else is still counted in "total" and in "other".
SASS_FAMILIES = (
    "HGMMA", "HMMA", "IMMA", "QGMMA", "LDSM", "STSM", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP",
    "USETMAXREG", "SYNCS", "BAR", "WARPGROUP", "MUFU.EX2", "MUFU.RCP", "MUFU.LG2", "MUFU",
    "FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "F2FP", "LDG", "STG", "LDS", "STS",
    "LDL", "STL", "SHFL", "IMAD", "LOP3", "ISETP", "BRA", "EXIT",
)


@dataclasses.dataclass(frozen=True)
class CensusSpec:
    """One compiled configuration of one kernel.

    ``fn`` is the ``@triton.jit`` or ``@gluon.jit`` function; ``signature`` maps every
    non-constexpr argument to its Triton type string (``"*fp16"``, ``"i32"``, ``"fp32"``,
    ``"tensordesc<...>"``); ``constexprs`` gives the constexpr arguments.
    """

    kernel: str                      # dotted public name, e.g. "portable.fwd"
    config: Mapping[str, Any]        # what a reader needs to tell configurations apart
    fn: Any
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    gluon: bool = False
    arches: tuple[str, ...] = tuple(ARCHES)   # architectures the configuration is meant for
    extra_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # constexprs that only a first compile can decide: ``resolve(compile_with, constexprs)`` returns
    # them filled in, ``compile_with(constexprs)`` compiling the kernel and ``compile_with(constexprs,
    # ttgir_only=True)`` giving its TTGIR alone (hopper.fwd's barrier offsets:
    # ``pipeline.resolve_shared_offsets``)
    resolve: Any = None
    # arguments compiled as divisible by 16 (``tt.divisibility`` 16), as Triton specializes a launch:
    # pointers 16-byte aligned, integers that are multiples of 16. Without it a census compiles a
    # binary no such launch runs (hopper.fwd's split-tail partial stores: 4-byte `STG.E` in place of
    # the launch's `STG.E.64`); :func:`as_launched` fills it from a launch's argument values
    aligned: tuple[str, ...] = ()


@dataclasses.dataclass
class CensusRow:
    kernel: str
    arch: str
    config: dict
    regs: int | None
    smem_bytes: int | None
    spill_bytes: int | None          # spill stores + loads, from ptxas -v (and cuobjdump LOCAL)
    sass: dict
    stack_bytes: int | None = None
    loops: list = dataclasses.field(default_factory=list)   # innermost_loops of the SASS
    error: str | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if d["error"] is None:
            del d["error"]
        return d


def _tool(name: str) -> str:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install triton (its wheel carries it) or the CUDA toolkit")
    return found


def _raw_fn(fn):
    """The plain Python function behind a jit object (interpreted or not)."""
    return getattr(fn, "fn", fn)


def spec_compiler(spec: CensusSpec, arch: str):
    """``compile_with(constexprs, ttgir_only=False)`` for ``spec`` on ``arch`` without a GPU: Triton's
    compiled kernel of ``spec`` with these constexprs, or (``ttgir_only``) its TTGIR text alone
    (``pipeline.ttgir_of``) — what ``spec.resolve`` is handed."""
    import triton
    from triton.backends.compiler import GPUTarget

    capability, _ = ARCHES[arch]
    target = GPUTarget("cuda", capability, 32)
    fn = spec.fn
    if spec.gluon:
        if needs_reexec():
            # Gluon functions decorated under the interpreter fail deep in code generation
            # ("'NVMMADistributedLayout' object has no attribute '_flatten_ir'"), and a warm cache
            # hides it: name the cause instead
            raise RuntimeError(
                "the census compiles real kernels: this process imported Triton under TRITON_INTERPRET=1 "
                "(tests/conftest.py sets it); compile in a process started with "
                "census.interpreter_free_env() (`flashrung census` re-executes itself without it)")
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
        from triton.runtime.jit import JITFunction
        if not isinstance(fn, JITFunction):
            raise RuntimeError(
                "the census compiles real kernels: run it without TRITON_INTERPRET=1 "
                "(`flashrung census` re-executes itself without it)")
    options = dict(num_warps=spec.num_warps, num_stages=spec.num_stages, **spec.extra_options)

    unknown = [name for name in spec.aligned if spec.signature.get(name, "")[:1] != "*"
               and spec.signature.get(name) not in _INTEGER_TYPES]
    if unknown:
        raise ValueError(f"aligned names pointer or integer arguments of the signature; not those: {unknown}")
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in spec.aligned} or None

    def compile_with(constexprs, ttgir_only=False):
        src = Source(fn=fn, signature=dict(spec.signature), constexprs=dict(constexprs), attrs=attrs)
        if ttgir_only:
            from flashrung.kernels.hopper.pipeline import ttgir_of
            return ttgir_of(src, target, options)
        return triton.compile(src, target=target, options=options)

    return compile_with


# (kernel, arch, signature, constexprs, alignment, options, resolver) → what ``spec.resolve`` filled
# in: a spec compiled again in one process (census_one, then a caller reading its PTX or TTGIR)
# resolves once; the compile itself is then Triton's cache
_RESOLVED: dict = {}


def compile_spec(spec: CensusSpec, arch: str):
    """Compile ``spec`` for ``arch`` without a GPU; returns Triton's compiled kernel."""
    compile_with = spec_compiler(spec, arch)
    constexprs = dict(spec.constexprs)
    if spec.resolve is not None:
        key = (spec.fn, arch, tuple(spec.signature.items()), tuple(sorted(constexprs.items())), spec.aligned,
               spec.num_warps, spec.num_stages, tuple(sorted(spec.extra_options.items())), spec.resolve)
        if key not in _RESOLVED:
            _RESOLVED[key] = spec.resolve(compile_with, constexprs)
        constexprs = dict(_RESOLVED[key])
    return compile_with(constexprs)


_INTEGER_TYPES = ("i32", "i64", "u32", "u64")


def contiguous_strides(tensors, seqlen: int, heads: int, head_dim: int) -> dict[str, int]:
    """``stride_{t}b``, ``stride_{t}s``, ``stride_{t}h`` of contiguous ``(B, S, H, D)`` tensors named
    ``t`` in ``tensors``: the stride arguments a launch on them passes (for :func:`as_launched`)."""
    strides = {"b": seqlen * heads * head_dim, "s": heads * head_dim, "h": head_dim}
    return {f"stride_{t}{axis}": v for t in tensors for axis, v in strides.items()}


def as_launched(spec: CensusSpec, values: Mapping[str, int], label: str) -> CensusSpec:
    """``spec`` as Triton specializes a launch whose integer arguments take ``values`` and whose
    pointers are 16-byte aligned (torch's allocations are): an integer equal to 1 becomes a
    constexpr, one divisible by 16 and every pointer are compiled as divisible by 16 (``aligned``);
    an integer argument that ``values`` does not name stays unspecialized, as do the ones the
    kernel declares ``do_not_specialize``. ``label`` names the launch in the configuration."""
    skip = set(getattr(spec.fn, "do_not_specialize", ()) or ())
    skip |= {spec.fn.arg_names[i] for i in skip if isinstance(i, int)}
    unknown = sorted(set(values) - {n for n, t in spec.signature.items() if t in _INTEGER_TYPES})
    if unknown:
        raise ValueError(f"values names integer arguments of the signature; not those: {unknown}")
    signature, constexprs, aligned = dict(spec.signature), dict(spec.constexprs), list(spec.aligned)
    for name, kind in spec.signature.items():
        if name in skip:
            continue
        if kind.startswith("*"):
            aligned.append(name)
        elif name in values and values[name] == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name in values and values[name] % 16 == 0:
            aligned.append(name)
    return dataclasses.replace(spec, signature=signature, constexprs=constexprs,
                               aligned=tuple(dict.fromkeys(aligned)), config={**spec.config, "launch": label})


_RES_RE = re.compile(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)")


def _res_usage(cubin_path: str) -> tuple[int, int, int, int]:
    out = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin_path], capture_output=True,
                         text=True, check=True).stdout
    m = _RES_RE.search(out)
    if not m:
        raise RuntimeError(f"could not read resource usage from cuobjdump:\n{out}")
    reg, stack, shared, local = map(int, m.groups())
    return reg, stack, shared, local


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


_PTX_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.M)
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_spills(ptx: str, log: str | None = None) -> tuple[int, int]:
    """(stack frame bytes, spill store + load bytes) as ``ptxas -v`` reports them for this PTX:
    read from ``log``, the ``ptxas -v`` output of the compile that assembled it
    (:func:`compile_with_ptxas_log`), or where there is none from a second ``ptxas -v`` run.

    cuobjdump's LOCAL stays 0 when ptxas spills into the stack frame, so spills are read here."""
    if log is not None:
        return _spills_in(log)
    target = _PTX_TARGET.search(ptx)
    if not target:
        raise RuntimeError("PTX without a .target line")
    from triton.backends.nvidia.compiler import get_ptxas
    capability = int(re.sub(r"\D", "", target.group(1)))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        # the same ptxas Triton assembles with (a newer one for sm_100+)
        out = subprocess.run([get_ptxas(capability).path, "-v", f"-arch={target.group(1)}", src, "-o",
                              os.path.join(tmp, "k.o")], capture_output=True, text=True, check=True)
    return _spills_in(out.stdout + out.stderr)


def _spills_in(log: str) -> tuple[int, int]:
    found = _PTXAS_SPILL.findall(log)
    if not found:
        raise RuntimeError(f"could not read spills from ptxas -v:\n{log[-2000:]}")
    stack = max(int(f[0]) for f in found)
    spills = sum(int(f[1]) + int(f[2]) for f in found)
    return stack, spills


def sass_text(cubin_path: str) -> str:
    return subprocess.run([_tool("cuobjdump"), "-sass", cubin_path], capture_output=True,
                          text=True, check=True).stdout


def compiled_sass(compiled) -> str:
    """:func:`sass_text` of a compiled kernel (``compile_spec``'s result), through a temporary cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return sass_text(path)


def count_sass(sass: str) -> dict:
    """Instruction-family counts of a SASS listing (static counts, not executed counts)."""
    opcodes = Counter(m.group(1) for m in _SASS_LINE.finditer(sass))
    counts: dict[str, int] = {}
    for fam in SASS_FAMILIES:
        n = 0
        for op, c in opcodes.items():
            if op == fam or op.startswith(fam + ".") or (fam == "SYNCS" and op.startswith("SYNCS")):
                n += c
        counts[fam] = n
    total = sum(opcodes.values())
    counts["total"] = total
    counts["opcodes"] = dict(sorted(opcodes.items()))
    return counts


_SASS_ADDRESSED = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA (0x[0-9a-f]+)")    # a branch and its target: backward when the target is not after it


_REGISTER = re.compile(r"\bR(\d+)\b")
# opcodes whose first operand is an address or nothing, not a register they write
_NO_DESTINATION = ("ST", "LDGSTS", "RED", "BAR", "BRA", "DEPBAR", "LDGDEPBAR", "MEMBAR", "EXIT", "NOP", "WARPSYNC")


def dependent_chain(instructions: list[str], family: str) -> int:
    """The longest chain of ``family`` instructions (``FMNMX``, ``FADD``, ...) in which each one reads
    a register the one before it wrote, in one pass over ``instructions`` (SASS text, issue order:
    a loop body read as one trip). A row reduction folded one value after another has a chain as
    long as its values; folded as a tree, its depth."""
    depth_of_register: dict[int, int] = {}
    longest = 0
    for text in instructions:
        text = text.strip()
        if text.startswith("@"):
            text = text.split(None, 1)[1]
        op, _, operands = text.partition(" ")
        regs = [int(r) for r in _REGISTER.findall(operands)]
        writes = bool(regs) and not op.startswith(_NO_DESTINATION) and operands.lstrip().startswith("R")
        sources = regs[1:] if writes else regs
        depth = 0
        if op.split(".")[0] == family:
            depth = 1 + max((depth_of_register.get(r, 0) for r in sources), default=0)
            longest = max(longest, depth)
        if writes:
            depth_of_register[regs[0]] = depth
    return longest


def turn_to_first_hgmma(instructions: list[str]) -> int | None:
    """Instructions from the last wait before a loop's first ``HGMMA`` — a ``BAR.SYNC`` or an
    mbarrier try-wait (``SYNCS.PHASECHK``) — to that ``HGMMA`` (None without either): in a pingpong
    loop, how long after its turn (a named barrier, or the token's mbarrier) a consumer hands the
    tensor pipe its first product. Where the pipe waits for that issue, each instruction placed
    between the two (descriptor arithmetic, register copies) is an issue slot on the step's critical
    path (with one Q buffer the d128 causal loop puts seven descriptor adds there, with two it issues
    first and adds after: 24 against 17)."""
    first = next((i for i, text in enumerate(instructions) if "HGMMA" in text), None)
    if first is None:
        return None
    waits = [i for i, text in enumerate(instructions[:first]) if "BAR.SYNC" in text or "SYNCS.PHASECHK" in text]
    return first - waits[-1] if waits else None


def innermost_loops(sass: str, min_length: int = 16) -> list[dict]:
    """:func:`count_sass` (families, ``length`` and ``sequence``, no per-opcode table) of every
    innermost loop of the listing of at least ``min_length`` instructions — a backward branch
    whose body holds no other such loop (shorter loops inside, an mbarrier's spin on its phase,
    do not make it outer) — in listing order. A kernel spends its time in these (a key loop, or
    its masked and unmasked copies), so a lever that should change a loop (a barrier, a copy, a
    mask) is read here rather than in whole-kernel counts, which the prologue and epilogue also
    move."""
    ins = [(int(a, 16), text.strip()) for a, text in _SASS_ADDRESSED.findall(sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for j, (a, text) in enumerate(ins):
        m = _BRANCH.search(text)
        target = int(m.group(1), 16) if m else None
        if target is not None and target <= a and target in where and j - where[target] + 1 >= min_length:
            loops.append((where[target], j))
    out = []
    for lo, hi in loops:
        if any(lo <= lo2 and hi2 <= hi and (lo2, hi2) != (lo, hi) for lo2, hi2 in loops):
            continue
        body = "\n".join(f"/*{a:04x}*/ {text} ;" for a, text in ins[lo:hi + 1])
        counts = count_sass(body)
        # the loop's instructions in issue order, by family (the first token of each opcode):
        # where a lever moves work rather than removing it, the order is the evidence
        counts["sequence"] = " ".join(op.split(".")[0] for op in _SASS_LINE.findall(body))
        del counts["opcodes"]
        counts["length"] = hi - lo + 1
        # the row max's dependency depth: a tree-shaped max shortens it, the count stays
        texts = [text for _, text in ins[lo:hi + 1]]
        counts["FMNMX_chain"] = dependent_chain(texts, "FMNMX")
        # the longest path a conditional forward branch inside the loop jumps over: a step whose
        # work sits behind a branch (a mask taken only on some trips) runs that many fewer
        # instructions on the trips that skip it
        skips = [0]
        for k in range(lo, hi):
            m = _BRANCH.search(ins[k][1])
            target = int(m.group(1), 16) if m else None
            if target is not None and ins[k][0] < target <= ins[hi][0] and target in where:
                skips.append(where[target] - k - 1)
        counts["forward_skip"] = max(skips)
        counts["turn_to_first_hgmma"] = turn_to_first_hgmma(texts)
        out.append(counts)
    return out


def compile_with_ptxas_log(spec: CensusSpec, arch: str):
    """:func:`compile_spec` and the ``ptxas -v`` output of the compile that assembled its binary
    (Triton runs ptxas with ``-v`` and prints that output when ``TRITON_DUMP_PTXAS_LOG`` asks), so
    the spills are read without assembling the PTX a second time (a second of a hopper.fwd build's
    census, sm_90a). None where no binary or more than one was assembled (Triton's cache held it;
    which output is whose is then not known)."""
    import contextlib
    import io

    from triton import knobs

    assembled = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        if not cache_hit:
            assembled.append(metadata.get("name"))

    printed = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(printed):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.listener = listener
        compiled = compile_spec(spec, arch)
    return compiled, (printed.getvalue() if len(assembled) == 1 else None)


def census_one(spec: CensusSpec, arch: str) -> CensusRow:
    try:
        compiled, log = compile_with_ptxas_log(spec, arch)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            with open(path, "wb") as f:
                f.write(compiled.asm["cubin"])
            reg, stack, shared_static, local = _res_usage(path)
            listing = sass_text(path)
            sass = count_sass(listing)
        _, spills = ptxas_spills(compiled.asm["ptx"], log)
        smem = int(compiled.metadata.shared)
        return CensusRow(spec.kernel, arch, dict(spec.config), reg, smem, max(local, spills), sass,
                         stack_bytes=stack, loops=innermost_loops(listing))
    except Exception as exc:  # a configuration that does not compile is a row, not a crash
        msg = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return CensusRow(spec.kernel, arch, dict(spec.config), None, None, None, {},
                         error=" ".join(msg)[:500])


def run_census(arch: str, kernel_filter: str | None = None, progress: bool = False) -> list[CensusRow]:
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {sorted(ARCHES)}, got {arch!r}")
    from flashrung.kernels.registry import census_specs

    specs = [s for s in census_specs() if arch in s.arches]
    if kernel_filter:
        specs = [s for s in specs if s.kernel.startswith(kernel_filter)
                 or re.fullmatch(kernel_filter.replace(".", r"\.").replace("*", ".*"), s.kernel)]
    it = specs
    if progress:
        from tqdm import tqdm
        it = tqdm(specs, desc=f"census {arch}", unit="kernel", file=sys.stderr)
    return [census_one(s, arch) for s in it]


def interpreter_free_env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


def needs_reexec() -> bool:
    """Kernels decorated under TRITON_INTERPRET=1 cannot be compiled; re-run in a clean process."""
    import triton
    return bool(triton.knobs.runtime.interpret)
