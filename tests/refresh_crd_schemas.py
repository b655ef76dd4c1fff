"""Refresh the CRD schema validators shipped inside deployctl (deployctl/render/crdschemas/).

``render --target k8s|k8s-rollout`` checks custom resources with the ajv validators the @kubernetes-models npm
packages compile from each project's CRD OpenAPI schema (deployctl/render/crdcheck.mjs). So that a pip install
validates without npm or a node tree in a checkout, the wheel carries the files those validators load: the
closure of ES-module imports from the modules in ``deployctl.render.crdvalidate.SCHEMAS``, each package's
package.json (node resolves the imports through their ``exports``), re2-wasm's .wasm, and SOURCES.json naming every
package with its pinned version, licence and registry tarball.

Usage (after ``bash tests/setup_test_venvs.sh`` installed NPM_PACKAGES into .node/):

    .venv/bin/python tests/refresh_crd_schemas.py [NODE_MODULES]     # default .node/node_modules
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "deployctl" / "render" / "crdschemas"
_IMPORT = re.compile(r"""(?:\bfrom|\bimport)\s*["']([^"']+)["']|\brequire\(\s*["']([^"']+)["']\s*\)""")
BUILTINS = ("fs", "path", "url", "util", "crypto", "os", "module", "worker_threads", "perf_hooks")
EXTRA = ("re2-wasm/build/wasm/re2.wasm",)  # read by re2-wasm at run time, not imported


def _package(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:2]) if path.startswith("@") else parts[0]


def _resolve(root: Path, spec: str, frm: str) -> str:
    """The file (relative to node_modules) that ``import spec`` in ``frm`` loads, as node resolves it."""
    p = os.path.normpath(os.path.join(os.path.dirname(frm), spec)) if spec.startswith(".") else spec
    for cand in (p, p + ".js", p + "/index.js"):
        if (root / cand).is_file():
            return cand
    pk = _package(p)
    rest = p[len(pk) + 1:]
    meta = json.loads((root / pk / "package.json").read_text())
    exports, key = meta.get("exports"), "./" + rest if rest else "."
    if isinstance(exports, dict):
        target = exports.get(key)
        for k, v in exports.items():
            if target is None and k.endswith("*") and key.startswith(k[:-1]):
                target = v.replace("*", key[len(k) - 1:]) if isinstance(v, str) else {
                    kk: x.replace("*", key[len(k) - 1:]) for kk, x in v.items() if isinstance(x, str)}
        if isinstance(target, dict):
            target = target.get("import") or target.get("default") or target.get("require")
        if isinstance(target, str):
            return os.path.normpath(os.path.join(pk, target))
    if not rest and meta.get("main"):
        return os.path.normpath(os.path.join(pk, meta["main"]))
    raise SystemExit(f"cannot resolve {spec!r} imported by {frm}")


def closure(root: Path) -> list[str]:
    """Every file (relative to node_modules) the SCHEMAS modules load."""
    sys.path.insert(0, str(ROOT))
    from deployctl.render.crdvalidate import SCHEMAS

    todo, seen = list(SCHEMAS.values()), set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        if f == "re2-wasm/build/wasm/re2.js":  # emscripten glue: its "imports" are inside generated strings
            continue
        for spec in (a or b for a, b in _IMPORT.findall((root / f).read_text())):
            if not spec.startswith("node:") and spec not in BUILTINS:
                todo.append(_resolve(root, spec, f))
    return sorted(seen | set(EXTRA))


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else ROOT / ".node" / "node_modules"
    files = closure(root)
    packages = sorted({_package(f) for f in files})
    lock = json.loads((root / ".package-lock.json").read_text()).get("packages", {})
    out = DEST / "node_modules"
    shutil.rmtree(out, ignore_errors=True)
    for f in files + [f"{p}/package.json" for p in packages] + [f"{p}/LICENSE" for p in packages]:
        if (root / f).is_file():
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / f, out / f)
    sources = {}
    for p in packages:
        meta = json.loads((root / p / "package.json").read_text())
        entry = lock.get(f"node_modules/{p}", {})
        name = meta["name"]
        sources[p] = {"version": meta["version"], "license": meta.get("license") or entry.get("license"),
                      "tarball": entry.get("resolved") or f"https://registry.npmjs.org/{name}/-/"
                                                          f"{name.rsplit('/', 1)[-1]}-{meta['version']}.tgz",
                      "integrity": entry.get("integrity")}
    (DEST / "SOURCES.json").write_text(json.dumps(
        {"about": "the files under node_modules/ are copied unchanged from these npm packages by "
                  "tests/refresh_crd_schemas.py (the validators crdcheck.mjs loads, and what they import)",
         "packages": sources}, indent=2, sort_keys=True) + "\n")
    size = sum((out / f).stat().st_size for f in files if (out / f).is_file())
    print(f"{len(files)} files, {size / 1e6:.1f} MB from {len(packages)} packages into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
