"""Check the shape of the neon variant's float32 GEMM micro-kernel in the compiled aarch64 code.

No aarch64 CPU is at hand to time the kernels, so this checks the code the compiler made of
the 8 x 12 tile (isa/_cyattn_vec_neon.h, inlined into micro_kernel_f32 of _gemm.pxi): it
disassembles the function with aarch64-linux-gnu-objdump, finds its loops (a backward
conditional branch and the instructions between its target and itself) and asserts that
exactly one loop is the k loop of the intended shape:

  * two k steps a pass (STEPS; the tile unrolls its loop by two): 48 FMLA by element
    (``fmla vD.4s, vN.4s, vM.s[i]``) with 24 distinct destinations (the accumulators stay in
    registers), 3 B and 2 A operands a step (at most 6 and 4 distinct registers);
  * 10 vector registers' worth of loads (per step A: 8 floats, B: 12 floats; ldp counts 2,
    ldr/ldur 1);
  * no access to the stack (sp) and no other store inside the loop: no spills.

In the neonbf16 module (FEAT_BF16) it also checks the bf16 tile (cyattn_bf16_tile_arm_hw,
isa/_cyattn_bf16_arm.h): exactly one loop of 16 BFDOT by element (``bfdot vD.4s, vN.8h,
vM.2h[i]``) into 16 distinct accumulators, 4 vector registers' worth of loads (B: 8 column pairs,
A: 8 row pairs), no stack access and no store: one k pair of an 8 x 8 strip in registers.

What it proves: the instructions gcc emitted for this build (gcc, flags and source as built by
tools/qemu_aarch64_check.sh) have the register-resident 8 x 12 shape, 24 FMAs per 5 loads. What
it does not: how fast an actual core runs them (no hardware timings exist; qemu counts nothing
about pipelines, latencies or caches), nor anything about the other kernels (softmax rows,
decode, attention tiles), whose correctness the test suites under qemu check instead. Copies of
the tile inlined elsewhere (the fused attention's task) are checked to have the same k loop, no
longer than the micro-kernel's.

Usage: python tools/aarch64_disasm_check.py OBJECT [--objdump aarch64-linux-gnu-objdump]
  OBJECT: the neon or neonbf16 module (cyattn/_kernels_neon*.so) or its .o, not stripped.
Exit status 0 when the shape holds, 1 otherwise (with the loops found).
"""
import argparse
import re
import subprocess
import sys

SYMBOL = re.compile(r"^[0-9a-f]+ <(?P<name>[^>]+)>:$")
INSN = re.compile(r"^\s*(?P<addr>[0-9a-f]+):\s+(?P<op>\S+)\s*(?P<args>.*?)\s*(//.*)?$")
FMLA_ELEM = re.compile(r"^(v\d+)\.4s, (v\d+)\.4s, (v\d+)\.s\[\d\]$")
BFDOT_ELEM = re.compile(r"^(v\d+)\.4s, (v\d+)\.8h, (v\d+)\.2h\[\d\]$")
BF16_TILE = "cyattn_bf16_tile_arm_hw"
BRANCH = re.compile(r"^([0-9a-f]+) <")
STEPS = 2      # k steps per pass of the loop (cyattn_tile8x12_f32 unrolls by two)


def functions(text, needle):
    """{symbol: [(addr, op, args)]} for symbols whose name contains needle."""
    out, cur = {}, None
    for line in text.splitlines():
        m = SYMBOL.match(line)
        if m:
            cur = m.group("name") if needle in m.group("name") else None
            if cur:
                out[cur] = []
            continue
        if cur is None:
            continue
        m = INSN.match(line)
        if m:
            out[cur].append((int(m.group("addr"), 16), m.group("op"), m.group("args")))
    return out


def branch_target(op, args, conditional_only=True):
    """The target address of a (conditional, unless not ``conditional_only``) branch, or None."""
    if not (op.startswith("b.") or op in ("cbnz", "cbz", "tbnz", "tbz")
            or (op == "b" and not conditional_only)):
        return None
    m = BRANCH.search(args.split(",")[-1].strip())
    return int(m.group(1), 16) if m else None


def loops(insns):
    """Bodies (lists of (addr, op, args)) of loops closed by a backward conditional branch."""
    found = []
    for idx, (addr, op, args) in enumerate(insns):
        target = branch_target(op, args)
        if target is not None and target <= addr:
            found.append([i for i in insns[:idx + 1] if i[0] >= target])
    return found


def shape(body, op_name="fmla", pattern=FMLA_ELEM):
    fmla = [pattern.match(args) for _, op, args in body if op == op_name]
    fmla = [m for m in fmla if m]
    loads = sum(2 if op == "ldp" else 1 for _, op, args in body
                if op in ("ldp", "ldr", "ldur", "ld1") and re.match(r"^q\d+", args))
    stack = [f"{op} {args}" for _, op, args in body if "sp" in re.findall(r"\bsp\b", args)]
    stores = [f"{op} {args}" for _, op, args in body if op.startswith(("st", "stp", "stur"))]
    return {
        "fmla_by_element": len(fmla),
        "accumulators": len({m.group(1) for m in fmla}),
        "b_operands": len({m.group(2) for m in fmla}),
        "a_operands": len({m.group(3) for m in fmla}),
        "vector_loads": loads,
        "stack_accesses": stack,
        "stores": stores,
        "instructions": len(body),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("object")
    ap.add_argument("--objdump", default="aarch64-linux-gnu-objdump")
    args = ap.parse_args()
    text = subprocess.run([args.objdump, "-d", "--no-show-raw-insn", args.object],
                          check=True, capture_output=True, text=True).stdout
    funcs = (functions(text, "_kernels_neon_micro_kernel_f32")
             or functions(text, "_kernels_neonbf16_micro_kernel_f32"))
    if not funcs:
        print(f"aarch64_disasm_check: no neon micro_kernel_f32 in {args.object}")
        return 1
    ok = check_bf16_tile(functions(text, BF16_TILE).get(BF16_TILE, []),
                         "_kernels_neonbf16_" in text)
    reference = None
    for name, insns in sorted(funcs.items()):
        shapes = [shape(b) for b in loops(insns)]
        good = [s for s in shapes if tile_shape(s)]
        print(f"{name}: {len(insns)} instructions, {len(shapes)} loops")
        for s in shapes:
            if s["fmla_by_element"]:
                print(f"  loop of {s['instructions']} instructions: {s['fmla_by_element']} "
                      f"fmla by element into {s['accumulators']} accumulators (B operands "
                      f"{s['b_operands']}, A operands {s['a_operands']}), "
                      f"{s['vector_loads']} vector loads, stack accesses "
                      f"{s['stack_accesses'] or 'none'}, stores {s['stores'] or 'none'}")
        if len(good) != 1:
            ok = False
            print(f"  FAILED: expected one k loop of the 8 x 12 shape, found {len(good)}")
        else:
            print(f"  ok: the k loop is the 8 x 12 tile in registers, {STEPS} k steps a pass "
                  f"({good[0]['instructions']} instructions: {24 * STEPS} fmla by element, "
                  f"{5 * STEPS} vector loads, no spills)")
            reference = reference or good[0]
    if reference is not None:
        ok = check_every_copy(text, reference) and ok
    return 0 if ok else 1


def innermost(body):
    """Whether a loop body (from loops()) holds no other loop: no backward branch before its
    own closing one lands inside it (an outer loop around one inlined tile also has 48 FMLA)."""
    start = body[0][0]
    for addr, op, args in body[:-1]:
        target = branch_target(op, args, conditional_only=False)
        if target is not None and start <= target <= addr:
            return False
    return True


def tile_shape(s):
    """Whether a loop's shape() is the 8 x 12 tile's k loop in registers."""
    return (s["fmla_by_element"] == 24 * STEPS and s["accumulators"] == 24
            and 3 <= s["b_operands"] <= 3 * STEPS and 2 <= s["a_operands"] <= 2 * STEPS
            and s["vector_loads"] == 5 * STEPS
            and not s["stack_accesses"] and not s["stores"])


def check_every_copy(text, reference):
    """Every other loop of the module with the tile's 48 FMLA (the copies the compiler inlined
    elsewhere, e.g. into the fused attention's task) has the same shape and no more
    instructions than the GEMM's: the attention's products run the same loop."""
    ok, copies = True, 0
    for name, insns in sorted(functions(text, "").items()):
        if "micro_kernel_f32" in name:
            continue
        for s in (shape(b) for b in loops(insns) if innermost(b)):
            if s["fmla_by_element"] != 24 * STEPS:
                continue
            copies += 1
            if not tile_shape(s) or s["instructions"] > reference["instructions"]:
                ok = False
                print(f"  FAILED: a copy of the tile's k loop in {name}: {s['instructions']} "
                      f"instructions, {s['accumulators']} accumulators, {s['vector_loads']} "
                      f"vector loads, stack accesses {s['stack_accesses'] or 'none'}, stores "
                      f"{s['stores'] or 'none'}")
    if ok:
        print(f"  ok: {copies} other copies of the k loop (inlined elsewhere) have its shape "
              f"and at most its {reference['instructions']} instructions")
    return ok


def check_bf16_tile(insns, required):
    """The BFDOT tile's k loop (neonbf16); without BFDOT in the function (the neon module runs
    the model there) nothing is checked unless ``required``."""
    shapes = [shape(b, "bfdot", BFDOT_ELEM) for b in loops(insns)]
    shapes = [s for s in shapes if s["fmla_by_element"]]
    if not shapes and not required:
        return True
    good = [s for s in shapes
            if s["fmla_by_element"] == 16 and s["accumulators"] == 16
            and s["b_operands"] == 2 and s["a_operands"] == 2 and s["vector_loads"] == 4
            and not s["stack_accesses"] and not s["stores"]]
    print(f"{BF16_TILE}: {len(insns)} instructions")
    for s in shapes:
        print(f"  loop of {s['instructions']} instructions: {s['fmla_by_element']} bfdot by "
              f"element into {s['accumulators']} accumulators, {s['vector_loads']} vector "
              f"loads, stack accesses {s['stack_accesses'] or 'none'}, stores "
              f"{s['stores'] or 'none'}")
    if len(good) != 1:
        print(f"  FAILED: expected one k loop of 16 bfdot by element in registers, found "
              f"{len(good)}")
        return False
    print(f"  ok: one k pair of an 8 x 8 strip a pass ({good[0]['instructions']} "
          f"instructions: 16 bfdot by element, 4 vector loads, no spills)")
    return True


if __name__ == "__main__":
    sys.exit(main())
