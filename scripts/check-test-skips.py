#!/usr/bin/env python3
"""Fails when a test can end green without having run (issue 27).

Scans crates/*/tests/**/*.rs. An early exit is a `return` (or `?`) in the body of a
`#[test]` function, of a helper returning `()` (outside its loops, where a `return` ends a
wait) or of a sweep returning its `usize` count, outside the closures and functions nested
in it. Each one must be *explained*: the statement that decides it (the `if`, `let ...
else` or `match` opening the block the `return` is in, and that block's text before it)
reads a CRYPTBLK_SKIP_* variable, or calls a helper that is skip-explicit:

  - its body reads a CRYPTBLK_SKIP_* variable (the documented, explicit escape hatch that
    CI never sets: scripts/test.sh and .ci/run are checked for it too), or
  - it returns Option/bool and each of its own early exits (`return None`, `return false`,
    `?`) is explained the same way, with no other None/false/`.ok()` of its own, or
  - it has no early exit and no `None`/`false` of its own, and calls a skip-explicit helper
    (e.g. `cryptsetup()` is `tool("cryptsetup").map(..)`).

So `if !is_root() { return; }`, `if which("fio").is_none() { return; }` or a helper that
answers None when a tool's output does not parse make this script fail. Early exits on a
*data* condition or that are plain control flow are listed in ALLOWED below with the
reason; an entry that no longer matches anything also fails, so the list cannot go stale.
Every tool a test asks for by `tool("x")`/`require_tool("x", ..)` must be named in
scripts/install-deps.sh.

Not a Rust parser: a lexer that blanks comments and literals, then brace matching (enough
for the shapes above; a syn-based checker would be one more crate to build for this).
Closures are not followed (a `return` in a server thread is that thread's business).
`--self-test` runs it on sources that must and must not be flagged (it also runs first on
every check); `--root DIR` checks another checkout.
"""
import os
import re
import sys

# (file relative to the repository, function) -> why an early exit there is a data
# condition, not a missing tool, root or service.
ALLOWED = {
    ("crates/cipher/tests/xts_paths.rs", "cpu_mask_changes_the_default_path"):
        "the re-executed child (XTS_PATHS_CHILD_EXPECT set by the parent) checks one mask "
        "and ends; the parent asserts each child's exit status",
    ("crates/cli/tests/common/reenc.rs", "finish_by_cryptsetup"):
        "control flow: cryptsetup's resume finished at the first try, so no repair is needed",
    ("crates/export/tests/nbd_concurrency.rs", "wait_gate"):
        "control flow: only the gated offset waits at the gate",
    ("crates/export/tests/export_trait.rs", "ublk_through_the_trait"):
        "without the kernel's ublk driver the test checks the refusal (start fails naming "
        "`modprobe ublk_drv`); the driver is a kernel module a container cannot load, and the "
        "device path runs in the kernel lab (tests/lab)",
}

KEYWORDS = {
    "if", "while", "match", "for", "loop", "return", "Some", "Ok", "Err", "None", "let",
    "else", "in", "as", "move", "unsafe", "fn", "assert", "assert_eq", "assert_ne",
    "panic", "eprintln", "println", "format", "vec", "matches", "write", "writeln",
}


def blank(src):
    """Returns `src` with comments, strings and char literals replaced by spaces (newlines
    kept), so braces and keywords in them do not count."""
    out = list(src)
    i, n = 0, len(src)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif re.match(r'b?r(#*)"', src[i:i + 40]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            wipe(i + m.end(), j - 1 - len(m.group(1)))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'", src[i:])
            if m:
                wipe(i + 1, i + m.end() - 1)
                i += m.end()
            else:
                i += 1  # a lifetime
        else:
            i += 1
    return "".join(out)


class Fn:
    def __init__(self, path, name, is_test, ret, start, open_, close):
        self.path, self.name, self.is_test, self.ret = path, name, is_test, ret
        self.start, self.open, self.close = start, open_, close


def match_brace(code, i):
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def functions(path, code):
    fns = []
    for m in re.finditer(r"\bfn\s+(\w+)", code):
        # The signature ends at the first `{` or `;` outside parentheses.
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue  # a declaration in a trait or extern block
        sig = code[m.end():j]
        ret = ""
        r = re.search(r"->\s*(.*?)(\bwhere\b|$)", sig, re.S)
        if r:
            ret = r.group(1).strip()
        # The attributes: the text since the end of the previous item.
        k = m.start()
        prev = max(code.rfind("}", 0, k), code.rfind(";", 0, k), code.rfind("{", 0, k))
        head = code[prev + 1:k]
        is_test = bool(re.search(r"#\[\s*(\w+::)*test\b", head))
        fns.append(Fn(path, m.group(1), is_test, ret, m.start(), j, match_brace(code, j)))
    return fns


def nested_spans(code, fn, all_fns):
    """Spans inside `fn` that belong to something else: nested functions and closures
    (a `return` there is theirs) and async blocks."""
    spans = [(g.open, g.close) for g in all_fns if fn.open < g.start < fn.close]
    if os.environ.get("CLOSURES"):
        return spans
    for m in re.finditer(r"\|[^|;{}]*\|\s*(->\s*[^{;]*)?\{|\|\|\s*(->\s*[^{;]*)?\{|\basync\s+(move\s+)?\{", code[fn.open + 1:fn.close]):
        o = fn.open + 1 + m.end() - 1
        spans.append((o, match_brace(code, o)))
    return spans


def guard(code, pos, lo):
    """The text deciding an exit at `pos`: for `?`, the statement it ends; for `return`,
    what opens the innermost block around it (if COND / let PAT = EXPR else / match EXPR),
    and for a `return` that is a match arm, the arm's pattern too."""
    depth, j = 0, pos
    while j > lo:
        j -= 1
        if code[j] == "}":
            depth += 1
        elif code[j] == "{":
            if depth == 0:
                break
            depth -= 1
    open_ = j
    if open_ <= lo:
        stmt_start = lo  # the function's own block: nothing opens it
    else:
        stmt_start = max(code.rfind(";", lo, open_), code.rfind("{", lo, open_), code.rfind("}", lo, open_), lo)
    opener = code[stmt_start + 1:open_]
    # Then the block's text before the exit: a match arm's pattern, `let x = f()?`, or an
    # `assert!(.. CRYPTBLK_SKIP_ ..)` ahead of the `return`. For `?` only its statement.
    inner_start = open_
    if code[pos] == "?":
        inner_start = max(code.rfind(";", open_, pos), code.rfind("}", open_, pos), open_)
    return [(stmt_start + 1, open_), (inner_start + 1, pos)]


SKIP_READ = re.compile(r"CRYPTBLK_SKIP_")
ENV_READ = re.compile(r"\bvar(_os)?\s*\(")


def names_skip(original):
    """Reads a CRYPTBLK_SKIP_* variable (the name and an env::var/var_os read)."""
    return bool(SKIP_READ.search(original) and ENV_READ.search(original))


def text(src, spans):
    return " ".join(src[a:b] for a, b in spans)


def loops(code, fn):
    """Loop bodies in `fn`: a unit helper's `return` there ends a wait or a scan, not a
    test. (A sweep returning its count is checked in loops too: `return 0` there skips.)"""
    spans = []
    for m in re.finditer(r"\b(loop|while|for)\b[^;{}]*\{", code[fn.open + 1:fn.close]):
        o = fn.open + 1 + m.end() - 1
        spans.append((o, match_brace(code, o)))
    return spans


def exits(code, fn, all_fns):
    spans = nested_spans(code, fn, all_fns)
    if not fn.is_test and fn.ret == "":
        spans += loops(code, fn)
    found = []
    for m in re.finditer(r"\breturn\b|\?(?=[\s;.)\],])", code[fn.open + 1:fn.close]):
        p = fn.open + 1 + m.start()
        if any(a < p <= b for a, b in spans):
            continue
        if m.group(0) == "?" and not fn.ret.startswith("Option"):
            continue  # `?` on a Result in a test returning Result fails the test
        found.append(p)
    return found


def crate_of(path):
    return path.split("/tests/")[0]


def calls(text):
    return {c for c in re.findall(r"\b([A-Za-z_]\w*)\s*(?:::<[^>]*>)?\s*\(", text) if c not in KEYWORDS}


def check(files):
    """files: {path: source}. Returns the list of problems."""
    codes = {p: blank(s) for p, s in files.items()}
    fns = {p: functions(p, c) for p, c in codes.items()}
    by_name = {}  # (crate, name) -> definitions: each test binary sees its crate's helpers
    for p, fs in fns.items():
        for f in fs:
            by_name.setdefault((crate_of(p), f.name), []).append(f)

    def body(f, original=False):
        src = files[f.path] if original else codes[f.path]
        return src[f.open:f.close + 1]

    explicit = set()  # (path, start) of skip-explicit helpers
    for f in [f for fs in fns.values() for f in fs]:
        if names_skip(body(f, True)):
            explicit.add((f.path, f.start))

    def explained(path, text, original):
        crate = crate_of(path)
        called = [g for c in calls(text) for g in by_name.get((crate, c), [])]
        if SKIP_READ.search(original) and (
            ENV_READ.search(original) or any(ENV_READ.search(body(g, True)) for g in called)
        ):
            # The variable is read here, or its name handed to a helper that reads it
            # (`require_tool("fio", "CRYPTBLK_SKIP_FIO")`).
            return True
        return any((g.path, g.start) in explicit for c in calls(text) for g in by_name.get((crate, c), []))

    changed = True
    while changed:
        changed = False
        for f in [f for fs in fns.values() for f in fs]:
            key = (f.path, f.start)
            if key in explicit or f.is_test:
                continue
            if not (f.ret.startswith("Option") or f.ret == "bool"):
                continue
            code = codes[f.path]
            ex = exits(code, f, fns[f.path])
            own = body(f)
            # What is left once the explained exits are cut out must not make a None or a
            # false of its own (a tail `.ok()`, a `None` arm...).
            rest = list(code)
            cut = list(nested_spans(code, f, fns[f.path]))
            ok = True
            for p in ex:
                g = guard(code, p, f.open)
                ok = ok and explained(f.path, text(code, g), text(files[f.path], g))
                cut.append((g[0][0], g[0][1] - 1))
            for a, b in cut:
                for k in range(a, b + 1):
                    rest[k] = " "
            rest = re.sub(r"\breturn\s+(None|false)\b", "", "".join(rest)[f.open:f.close + 1])
            if re.search(r"\b(None|false)\b|\.ok\(\)", rest):
                ok = False
            if not ex:
                ok = ok and explained(f.path, own, "")
            if ok:
                explicit.add(key)
                changed = True

    problems, used = [], set()
    for path, fs in fns.items():
        code = codes[path]
        for f in fs:
            if not (f.is_test or f.ret in ("", "usize")):
                continue
            for p in exits(code, f, fs):
                sp = guard(code, p, f.open)
                g, go = text(code, sp), text(files[path], sp)
                if explained(path, g, go):
                    continue
                if (path, f.name) in ALLOWED:
                    used.add((path, f.name))
                    continue
                line = code.count("\n", 0, p) + 1
                what = "test" if f.is_test else "helper"
                problems.append(
                    f"{path}:{line}: {what} `{f.name}` exits early on `{' '.join(go.split())[:120]}`: "
                    "make a missing tool/root/service fail the test (or skip only on CRYPTBLK_SKIP_*), "
                    "or list a data condition in ALLOWED with the reason"
                )
    for key in set(ALLOWED) - used:
        if key[0] in files:
            problems.append(f"{key[0]}: ALLOWED entry for `{key[1]}` matches no early exit: remove it")
    return problems


def self_test():
    tool = '''
fn tool(n: &str) -> Option<Command> {
    if found(n) { return Some(Command::new(n)); }
    if std::env::var("CRYPTBLK_SKIP_X").is_ok() { return None; }
    panic!("missing");
}
fn cryptsetup() -> Option<Command> { tool("cryptsetup").map(|mut c| { c.arg("-q"); c }) }
fn is_root() -> bool { unsafe { libc::geteuid() == 0 } }
fn found(n: &str) -> bool { std::path::Path::new(n).exists() }
fn parsed(o: &str) -> Option<u32> { let c = cryptsetup()?; o.parse().ok() }
fn image(d: &Path) -> Option<u32> { let Some(c) = cryptsetup() else { return None }; Some(1) }
fn data(d: &Path) -> Option<u32> { let _ = cryptsetup()?; if d.exists() { return None; } Some(1) }
'''
    must_pass = {
        "a": '#[test]\nfn t() { let Some(_) = tool("fio") else { return }; let s = "{"; }',
        "b": '#[test]\nfn t() { if cryptsetup().is_none() { eprintln!("skip"); return; } }',
        "c": '#[test]\nfn t() { let Some(x) = image(p) else { return; }; }',
        "d": '#[test]\nfn t() { std::thread::spawn(move || { if done { return; } }); let c = \'}\'; }',
        "e": '#[test]\nfn t() { match cryptsetup() { Some(c) => c, None => return }; }',
        "f": '#[test]\nfn t() -> Result<(), E> { let x = f()?; Ok(()) }',
    }
    must_fail = {
        "g": '#[test]\nfn t() { if !is_root() { return; } }',
        "h": '#[test]\nfn t() { if which("fio").is_none() {\n eprintln!("skipped"); return; } }',
        "i": '#[test]\nfn t() { let Some(v) = parsed("x") else { return }; }',
        "j": '#[test]\nfn t() { let Some(v) = data(p) else { return }; }',
        "k": 'fn sweep(n: u32) { if std::env::var_os("CEPH_CONF").is_none() { return; } }',
        "l": '#[test]\n#[ignore]\nfn t() { if !std::path::Path::new("/dev/fuse").exists() { return } }',
        # A `?` at a helper's top level is decided by its own statement, not by the text
        # before the function (here `tool`, which reads CRYPTBLK_SKIP_X).
        "m": 'fn top(o: &str) -> Option<u32> { let n = o.parse::<u32>().ok()?; Some(n) }\n'
             '#[test]\nfn t() { let Some(_) = top("x") else { return }; }',
        # A sweep's `return 0` in its loop skips every cut.
        "n": 'fn sweep() -> usize { let mut c = 0; for i in 0..9 { let Some(_) = parsed("y") else { return 0 }; c += 1; } c }',
    }
    bad = []
    for k, s in must_pass.items():
        if check({k: tool + s}):
            bad.append(f"flagged but explicit: {k}: {check({k: tool + s})}")
    for k, s in must_fail.items():
        if not check({k: tool + s}):
            bad.append(f"not flagged: {k}")
    for b in bad:
        print("self-test:", b, file=sys.stderr)
    return not bad


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if "--root" in sys.argv:  # check another checkout (e.g. before a change)
        root = sys.argv[sys.argv.index("--root") + 1]
    if not os.environ.get("CLOSURES") and not self_test():
        return 2
    if "--self-test" in sys.argv:
        print("check-test-skips: self-test passed")
        return 0
    files = {}
    for crate in sorted(os.listdir(os.path.join(root, "crates"))):
        tdir = os.path.join(root, "crates", crate, "tests")
        for d, _, names in os.walk(tdir):
            for name in names:
                if name.endswith(".rs"):
                    p = os.path.join(d, name)
                    with open(p, encoding="utf-8") as fh:
                        files[os.path.relpath(p, root)] = fh.read()
    problems = check(files)
    # A tool a test requires is one scripts/install-deps.sh installs.
    with open(os.path.join(root, "scripts/install-deps.sh"), encoding="utf-8") as fh:
        deps = fh.read()
    for path, src in sorted(files.items()):
        for m in re.finditer(r'\b(?:tool|require_tool)\(\s*"([^"]+)"', src):
            name = m.group(1)
            if not re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w.-])", deps):
                line = src.count("\n", 0, m.start()) + 1
                problems.append(f"{path}:{line}: the test requires `{name}`, which scripts/install-deps.sh does not install")
    # The escape hatch is explicit only if CI never pulls it.
    for ci in ("scripts/test.sh", ".ci/run"):
        with open(os.path.join(root, ci), encoding="utf-8") as fh:
            if re.search(r"CRYPTBLK_SKIP_[A-Z0-9_]+=", fh.read()):
                problems.append(f"{ci}: sets a CRYPTBLK_SKIP_* variable: CI must run every test")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-test-skips: {len(problems)} problem(s): a test could pass without having run", file=sys.stderr)
        return 1
    print(f"check-test-skips: {len(files)} test sources, every early exit explicit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
