"""Build the docs site from the notebooks: run every chapter, render it to static HTML, add an API reference.

    python scripts/build_docs.py               # -> _site/ (what `make docs` runs)
    python scripts/build_docs.py --jobs 2      # run two chapters at a time
    python scripts/build_docs.py --cache .docs-cache  # reuse outputs of notebooks that did not change
    python scripts/build_docs.py --run-only --jobs 2 --cache .docs-cache  # run the chapters, build nothing
                                                                        # (`make test-nbs`; `make docs` reuses it)

Every notebook in nbs/ runs in a fresh Python process with nbdev's executor, in nbs/, skipping the cells
nbdev-test skips (`#| eval: false`, the `tst_flags`) and GPU-only cells (`#| gpu`); a failing cell fails
the build. The pages are plain HTML and one stylesheet: no CDN, no web fonts, no JavaScript. Each
chapter's wall time (a fresh process, imports included) goes to _site/timings.json.

A cached notebook's outputs are reused only while its bytes, every file of helios/ and the HELIOS_* environment
variables are the same: `make test` runs each chapter once and `make docs` renders what that run printed
(timings.json lists those chapters under `cached`; their seconds are that run's, two chapters at a time).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import html
import importlib
import inspect
import json
import os
import pkgutil
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"
REPO_URL = re.search(r'^Repository = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
GPU_FLAG = "gpu"
EXPORT_DIRECTIVES = {"export", "exporti", "exports"}


# ---- which notebooks, in which order ----

def chapter_key(nb_path: Path) -> tuple[int, str]:
    "11_engine -> (11, ''), 11a_structured_output -> (11, 'a'): a lettered chapter follows its number."
    number, letter = re.match(r"(\d+)([a-z]?)_", nb_path.name).groups()
    return int(number), letter


def notebooks() -> list[Path]:
    "index first, then the chapters in numeric order (whatever nbs/ holds)."
    chapters = sorted(NBS.glob("[0-9]*_*.ipynb"), key=chapter_key)
    return [NBS / "index.ipynb", *chapters]


APPENDED_PAGES = ("glossary.ipynb",)  # pages of prose without a number, after the chapters


def site_notebooks() -> list[Path]:
    "The site's pages in the sidebar's order: the notebooks above, then the glossary."
    return notebooks() + [NBS / name for name in APPENDED_PAGES if (NBS / name).exists()]


def page_name(nb_path: Path) -> str:
    "nbdev's page name for a notebook (08_paged_pool.ipynb -> paged_pool.html), as module docstrings link it."
    return re.sub(r"^\d+[a-zA-Z0-9]*_", "", nb_path.stem) + ".html"


def directives(source: str) -> dict[str, str]:
    "nbdev's `#| name: value` lines at the top of a code cell."
    out = {}
    for line in source.splitlines():
        if not line.startswith("#|"): break
        name, _, value = line[2:].strip().partition(" ")
        out[name.rstrip(":")] = value.strip()
    return out


def skip_reason(source: str, skip_flags: set[str]) -> str | None:
    "Why the docs build does not run this code cell (None: it runs)."
    d = directives(source)
    if GPU_FLAG in d: return "GPU only: not run when the docs are built"
    if d.get("eval", "").lower() == "false": return "not run when the docs are built (`eval: false`)"
    if skip_flags & d.keys(): return f"not run when the docs are built (`{' '.join(sorted(skip_flags & d.keys()))}`)"
    return None


def tst_flags() -> set[str]:
    "The flags whose cells nbdev-test skips (pyproject's [tool.nbdev] tst_flags)."
    from nbdev.config import get_config
    flags = get_config(path=ROOT).tst_flags
    return set(flags.split() if isinstance(flags, str) else flags)


# ---- running a notebook (in a child process) ----

def execute_notebook(src: Path, dest: Path):
    "Run src's cells as nbdev-test would, plus skip GPU cells; write every cell's outputs to dest as JSON."
    from execnb.shell import CaptureShell
    from nbdev.process import NBProcessor
    nb = NBProcessor(src, rm_directives=False, process=True).nb
    flags = tst_flags()
    os.environ["IN_TEST"] = "1"  # as nbdev-test sets it
    shell = CaptureShell(src)
    os.chdir(src.parent)
    failed = False
    try:
        shell.run_all(nb, exc_stop=True, preproc=lambda c: c.cell_type != "code" or skip_reason(c.source, flags))
    except BaseException as e:
        sys.stderr.write((shell.prettytb(fname=src) or repr(e)) + "\n")
        failed = True
    dest.write_text(json.dumps([c.get("outputs", []) if c.cell_type == "code" else [] for c in nb.cells]))
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(1 if failed else 0)  # and engine or server threads a chapter leaves behind cannot keep it alive


class ChapterFailed(Exception):
    "A notebook raised; its outputs up to the failing cell are still rendered."


class Ran(NamedTuple):
    "What running a notebook gave."
    outputs: list          # every cell's outputs ([] for markdown), up to the failing cell
    seconds: float         # its wall time in a fresh process: that run's, when it came from the cache
    error: str | None      # why it failed, or None
    cached: bool = False   # reused from --cache (run earlier, e.g. by `make test-nbs`, two at a time)


def run_notebook(nb_path: Path, work: Path, cache: Path | None) -> Ran:
    "Run nb_path in a fresh process, or reuse its cached outputs while the notebook, helios/ and settings are the same."
    settings = "".join(f"{k}={v}\n" for k, v in sorted(os.environ.items()) if k.startswith("HELIOS_")).encode()
    sources = b"".join(p.read_bytes() for p in sorted((ROOT / "helios").rglob("*.py")))
    digest = hashlib.sha256(nb_path.read_bytes() + sources + settings).hexdigest()
    cached = cache / f"{nb_path.stem}.json" if cache else None
    if cached and cached.exists():
        entry = json.loads(cached.read_text())
        if entry["digest"] == digest: return Ran(entry["outputs"], entry["seconds"], None, cached=True)
    dest = work / f"{nb_path.stem}.json"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--execute", str(nb_path), "--to", str(dest)],
                          capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "agg"})
    seconds = time.perf_counter() - start
    outputs = json.loads(dest.read_text()) if dest.exists() else []
    if proc.returncode != 0:
        return Ran(outputs, seconds, f"{nb_path.name} failed after {seconds:.0f} s:\n{proc.stderr[-6000:]}")
    if cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"digest": digest, "seconds": seconds, "outputs": outputs}))
    return Ran(outputs, seconds, None)


# ---- rendering ----

def markdown_renderer():
    from markdown_it import MarkdownIt

    def heading_open(self, tokens, idx, options, env):
        tokens[idx].attrSet("id", slug(tokens[idx + 1].content))
        return self.renderToken(tokens, idx, options, env)

    fence = lambda code, lang, _attrs: f'<pre class="highlight"><code>{highlight(code, lang)}</code></pre>'
    md = MarkdownIt("commonmark", {"html": True, "highlight": fence}).enable(["table", "strikethrough"])
    md.add_render_rule("heading_open", heading_open)
    return md


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def highlight(code: str, lang: str = "python") -> str:
    "Pygments' HTML spans for code (no wrapper)."
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound
    try: lexer = get_lexer_by_name(lang or "text")
    except ClassNotFound: lexer = get_lexer_by_name("text")
    return pyg(code, lexer, HtmlFormatter(nowrap=True))


class LinkError(ValueError):
    "A link in a notebook points at nothing."


def rewrite_links(body: str, source: str) -> str:
    "Links to notebooks become links to their pages; other repository paths go to the repository on GitHub."
    def fix(m):
        attr, href = m.group(1), html.unescape(m.group(2))
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", href): return m.group(0)
        path, _, frag = href.partition("#")
        target = (NBS / path).resolve()
        if not target.exists():
            raise LinkError(f"{source}: the link {href!r} points at {target.relative_to(ROOT.parent)}, which does not exist")
        if target.suffix == ".ipynb" and target.parent == NBS:
            new = page_name(target) + (f"#{frag}" if frag else "")
        else:
            rel = target.relative_to(ROOT).as_posix()
            new = f"{REPO_URL}/{'tree' if target.is_dir() else 'blob'}/main/{rel}" + (f"#{frag}" if frag else "")
        return f'{attr}="{html.escape(new)}"'
    return re.sub(r'(href)="([^"]*)"', fix, body)


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def clean_stream(text: str) -> str:
    "Terminal text as it would finally look: no colour codes, progress bars at their last state."
    lines = [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", text).split("\n")]
    return "\n".join(lines)


def render_output(out: dict, images: list[tuple[str, bytes]], stem: str) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        text = clean_stream("".join(out.get("text", "")))
        return f'<pre class="output {out.get("name", "stdout")}">{html.escape(text)}</pre>' if text.strip() else ""
    if kind == "error":
        return f'<pre class="output error">{html.escape(clean_stream(chr(10).join(out.get("traceback", []))))}</pre>'
    data, meta = out.get("data", {}), out.get("metadata", {})
    if "image/png" in data:
        name = f"img/{stem}-{len(images) + 1}.png"
        images.append((name, base64.b64decode("".join(data["image/png"]))))
        size = meta.get("image/png", {})
        width = f' width="{size["width"]}"' if "width" in size else ""
        return f'<div class="output image"><img src="{name}"{width} alt="figure {len(images)} of {stem}"></div>'
    if "image/svg+xml" in data: return f'<div class="output image">{"".join(data["image/svg+xml"])}</div>'
    if "text/html" in data: return f'<div class="output html">{"".join(data["text/html"])}</div>'
    if "text/markdown" in data: return f'<div class="output markdown">{MD.render("".join(data["text/markdown"]))}</div>'
    if "text/plain" in data: return f'<pre class="output result">{html.escape(clean_stream("".join(data["text/plain"])))}</pre>'
    return ""


def render_code_cell(source: str, outputs: list, flags: set[str], images: list, stem: str) -> str:
    d = directives(source)
    if "hide" in d or d.get("include") == "false": return ""
    code = "\n".join(l for l in source.splitlines() if not l.startswith("#|")).strip("\n")
    parts = []
    if d.get("echo") != "false" and code:
        label = '<span class="badge">exported</span>' if d.keys() & EXPORT_DIRECTIVES else ""
        reason = skip_reason(source, flags)
        note = f'<span class="badge skipped">{html.escape(reason)}</span>' if reason else ""
        parts.append(f'<div class="input">{label}{note}<pre class="highlight">{highlight(code)}</pre></div>')
    if d.get("output") != "false":
        parts.extend(filter(None, (render_output(o, images, stem) for o in outputs)))
    return f'<div class="cell code">{"".join(parts)}</div>' if parts else ""


def notebook_title(nb: dict) -> str:
    "The `# Title` of a notebook's first cell."
    title = re.search(r"^#\s+(.+)$", "".join(nb["cells"][0]["source"]), re.M)
    return title.group(1).strip() if title else "Untitled"


def render_notebook(nb: dict, outputs: list, stem: str, images: list) -> str:
    flags = tst_flags()
    cells = []
    for cell, outs in zip(nb["cells"], outputs + [[]] * (len(nb["cells"]) - len(outputs))):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            cells.append(f'<div class="cell markdown">{MD.render(source)}</div>')
        elif cell["cell_type"] == "code":
            cells.append(render_code_cell(source, outs, flags, images, stem))
    return rewrite_links("\n".join(filter(None, cells)), f"nbs/{stem}.ipynb")


def short_title(nb_path: Path, title: str) -> str:
    "The sidebar's text for a notebook: its number and its title, without markdown."
    title = title.replace("`", "")
    if nb_path.stem == "index": return "Introduction"
    return f"{nb_path.stem.split('_')[0]} · {title}" if re.match(r"\d", nb_path.stem) else title


def page(title: str, body: str, nav: list[tuple[str, str]], current: str, prev_next: str = "", source_links: str = "") -> str:
    items = "\n".join(f'<li{" class=current" if href == current else ""}><a href="{href}">{html.escape(text)}</a></li>'
                      for href, text in nav)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · Helios</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="style.css">
</head>
<body>
<nav class="sidebar" aria-label="chapters">
<a class="brand" href="index.html">Helios</a>
<ol>
{items}
</ol>
</nav>
<main>
{source_links}
<article>
{body}
</article>
{prev_next}
<footer>Built from the notebooks in <a href="{REPO_URL}/tree/main/nbs">nbs/</a> by <code>make docs</code>.</footer>
</main>
</body>
</html>
"""


def pager(pages: list[tuple[str, str]], i: int) -> str:
    prev = f'<a class="prev" href="{pages[i - 1][0]}">← {html.escape(pages[i - 1][1])}</a>' if i > 0 else "<span></span>"
    nxt = f'<a class="next" href="{pages[i + 1][0]}">{html.escape(pages[i + 1][1])} →</a>' if i + 1 < len(pages) else "<span></span>"
    return f'<nav class="pager" aria-label="previous and next">{prev}{nxt}</nav>'


# ---- the API reference ----

def public_modules() -> list:
    import helios
    names = [m.name for m in pkgutil.walk_packages(helios.__path__, "helios.")
             if not any(part.startswith("_") for part in m.name.split("."))]
    return [importlib.import_module(n) for n in sorted(names)]


def format_annotation(a) -> str:
    if a is inspect.Parameter.empty: return ""
    return a if isinstance(a, str) else inspect.formatannotation(a)


def format_signature(obj) -> str:
    "A signature as source code spells it (string annotations unquoted; a class without its `-> None`)."
    try: sig = inspect.signature(obj)
    except (TypeError, ValueError): return "(...)"
    params, seen_kwonly = [], False
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not seen_kwonly:
            seen_kwonly = True
            params.append("*")
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        ann = format_annotation(p.annotation)
        if ann: text += f": {ann}"
        if p.default is not p.empty:
            default = "..." if repr(p.default).startswith("<") else repr(p.default)  # <_io.TextIOWrapper ...>
            text += f" = {default}" if ann else f"={default}"
        params.append(text)
        if p.kind is p.VAR_POSITIONAL: seen_kwonly = True
    ret = "" if inspect.isclass(obj) else format_annotation(sig.return_annotation)
    return f"({', '.join(params)})" + (f" -> {ret}" if ret else "")


def own_doc(obj) -> str | None:
    "The docstring written on obj itself (not inherited, not a dataclass's generated signature)."
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")): return None
    return inspect.cleandoc(doc)


def doc_html(obj) -> str:
    doc = own_doc(obj)
    return f'<div class="doc">{MD.render(doc)}</div>' if doc else ""


def class_members(cls) -> list[str]:
    out = []
    for name, attr in vars(cls).items():
        if name.startswith("_") or name in getattr(cls, "_fields", ()): continue
        if isinstance(attr, property):
            out.append(f'<div class="member"><code class="sig"><b>{name}</b></code> <span class="kind">property</span>{doc_html(attr)}</div>')
        elif isinstance(attr, (staticmethod, classmethod)) or inspect.isfunction(attr):
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            kind = {staticmethod: "staticmethod", classmethod: "classmethod"}.get(type(attr), "")
            sig = format_signature(fn)
            if kind == "classmethod": sig = re.sub(r"^\(cls,? ?", "(", sig)
            elif not kind: sig = re.sub(r"^\(self,? ?", "(", sig)
            badge = f' <span class="kind">{kind}</span>' if kind else ""
            out.append(f'<div class="member"><code class="sig"><b>{name}</b>{html.escape(sig)}</code>{badge}{doc_html(fn)}</div>')
    return out


def api_entry(module_name: str, name: str, obj) -> str:
    anchor = f"{module_name}.{name}"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException): head, sig = "exception", ""
        elif hasattr(obj, "__members__") and hasattr(obj, "_member_map_"):
            head, sig = "enum", ""
        else: head, sig = "class", format_signature(obj)
        body = doc_html(obj)
        if head == "enum": body += f'<p class="members">{", ".join(f"<code>{m}</code>" for m in obj.__members__)}</p>'
        members = class_members(obj) if head == "class" else []
        body += "".join(members)
    elif callable(obj):
        head, sig, body = "def", format_signature(obj), doc_html(obj)
    else:
        value = "{" + ", ".join(map(repr, sorted(obj))) + "}" if isinstance(obj, (set, frozenset)) else repr(obj)
        value = re.sub(r" at 0x[0-9a-f]+", "", value)  # a function's address changes every run
        head, sig, body = "", f" = {value if len(value) < 80 else value[:77] + '...'}", ""
    kw = f'<span class="kw">{head}</span> ' if head else ""
    return (f'<section class="api-entry" id="{anchor}"><h3><code>{kw}<b>{html.escape(name)}</b>'
            f'{html.escape(sig)}</code></h3>{body}</section>')


def chapter_of(module) -> str | None:
    "The notebook a module is exported from (nbdev writes it in the first line)."
    head = Path(module.__file__).read_text()[:2000]
    m = re.search(r"File to edit: (?:\.\./)+nbs/([\w.]+\.ipynb)", head)
    return m.group(1) if m else None


def render_api() -> str:
    import helios
    modules = public_modules()
    where = {id(getattr(m, n)): f"{m.__name__}.{n}" for m in modules for n in getattr(m, "__all__", [])}
    top = "".join(f'<li><a href="#{where.get(id(getattr(helios, n)), "")}"><code>helios.{n}</code></a>'
                  f' — {MD.renderInline((own_doc(getattr(helios, n)) or "").split(chr(10))[0])}</li>'
                  for n in helios.__all__)
    parts = [f"<h1>API reference</h1><p>Signatures and docstrings of the public API: what <code>helios</code> "
             f"exports, then every module's <code>__all__</code>, each next to the chapter that explains it.</p>"
             f'<h2 id="helios">helios</h2><pre class="highlight">{highlight("from helios import " + ", ".join(helios.__all__))}</pre><ul>{top}</ul>']
    toc = []
    for mod in modules:
        names = getattr(mod, "__all__", [])
        if not names: continue
        nb = chapter_of(mod)
        link = f' <a class="chapter-link" href="{page_name(Path(nb))}">chapter {nb.split("_")[0]}</a>' if nb else ""
        toc.append(f'<a href="#{mod.__name__}"><code>{mod.__name__}</code></a>')
        summary = (inspect.getdoc(mod) or "").split("\n\n")[0]
        parts.append(f'<h2 id="{mod.__name__}"><code>{mod.__name__}</code>{link}</h2>'
                     + (f"<p>{MD.renderInline(summary)}</p>" if summary else "")
                     + "".join(api_entry(mod.__name__, n, getattr(mod, n)) for n in names))
    parts.insert(1, f'<p class="toc">Modules: {" · ".join(toc)}</p>')
    return "\n".join(parts)


# ---- the site ----

STYLE = """
:root { --fg: #1d2125; --muted: #5b6570; --accent: #b3541e; --bg-code: #f6f7f9; --line: #e2e5e9; }
* { box-sizing: border-box; }
body { margin: 0; display: flex; color: var(--fg); font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
a { color: var(--accent); }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 13.5px; }
.sidebar { width: 17rem; flex: none; height: 100vh; position: sticky; top: 0; overflow-y: auto; padding: 1.2rem 1rem; border-right: 1px solid var(--line); background: #fbfbfc; font-size: 14px; }
.sidebar .brand { display: block; font-size: 1.4rem; font-weight: 700; color: var(--fg); text-decoration: none; margin-bottom: .8rem; }
.sidebar ol { list-style: none; padding: 0; margin: 0; }
.sidebar li a { display: block; padding: .22rem .5rem; border-radius: 4px; color: var(--fg); text-decoration: none; }
.sidebar li a:hover { background: #eef0f3; }
.sidebar li.current a { background: #f7e6dc; color: var(--accent); font-weight: 600; }
main { flex: 1; min-width: 0; max-width: 62rem; padding: 1.5rem 2.5rem 3rem; }
.source-links { font-size: 14px; color: var(--muted); }
.source-links a { margin-right: 1rem; }
article h1 { margin-top: .4rem; font-size: 2rem; }
h1 code, h2 code { font-size: inherit; }
article h2 { margin-top: 2rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
blockquote { margin: 0 0 1rem; padding: .2rem 1rem; border-left: 4px solid var(--accent); color: var(--muted); font-size: 1.05rem; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--bg-code); }
pre { background: var(--bg-code); padding: .7rem .9rem; overflow-x: auto; border-radius: 6px; margin: .4rem 0; }
.cell.code { margin: 1rem 0; }
.input { position: relative; }
.badge { display: inline-block; font-size: 11px; color: var(--muted); border: 1px solid var(--line); border-radius: 3px; padding: 0 .35rem; margin-bottom: 2px; }
.badge.skipped { color: #8a5a00; border-color: #e7c980; background: #fff8e6; margin-left: .3rem; }
pre.output { background: #fff; border: 1px solid var(--line); border-left: 3px solid #9aa5b1; white-space: pre-wrap; overflow-wrap: anywhere; }
article :is(p, li, td) > code { background: var(--bg-code); padding: 0 .25em; border-radius: 3px; }
pre.output.stderr { border-left-color: #d6a04c; color: #5a4a2a; }
pre.output.error { border-left-color: #c0392b; color: #7b241c; }
.output.image img { max-width: 100%; height: auto; }
.output.html { overflow-x: auto; }
.pager { display: flex; justify-content: space-between; margin-top: 2.5rem; padding-top: 1rem; border-top: 1px solid var(--line); }
footer { margin-top: 2rem; color: var(--muted); font-size: 13px; }
.api-entry { margin: 1.2rem 0 1.6rem; padding-left: .8rem; border-left: 3px solid var(--line); }
.api-entry h3 { font-size: 15px; margin: 0 0 .3rem; font-weight: normal; }
.api-entry .kw { color: #7a3e9d; }
.member { margin: .5rem 0 .5rem 1rem; }
.member .doc p { margin: .2rem 0; }
.kind { font-size: 12px; color: var(--muted); }
.chapter-link { font-size: 14px; font-weight: normal; margin-left: .6rem; }
.toc { line-height: 2; }
@media (max-width: 50rem) { body { display: block; } .sidebar { position: static; width: auto; height: auto; border-right: 0; border-bottom: 1px solid var(--line); } main { padding: 1rem; } }
"""


# the chapters that run longest (`make test-nbs` on 2 Xeon cores, load 1-3: 92_kernels 288 s, 15_performance 196 s, 12_llm 79 s,
# 16_parallel 69 s, the rest under 55 s); started first, so the last minutes do not run one chapter alone
LONGEST_FIRST = ("92_kernels", "15_performance", "12_llm", "16_parallel")


def longest_first(paths: list[Path]) -> list[Path]:
    "paths with those of LONGEST_FIRST moved to the front, in its order; the others keep theirs."
    first = [p for name in LONGEST_FIRST for p in paths if p.stem == name]
    return first + [p for p in paths if p not in first]


def run_all(paths: list[Path], jobs: int, cache: Path | None) -> tuple[dict[Path, Ran], float]:
    "Every notebook's Ran, `jobs` at a time (the longest first), and the wall time of it all."
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(jobs) as pool:
        def run(p):
            ran = run_notebook(p, Path(work), cache)
            print(f"  {p.name:28s} {ran.seconds:6.1f} s{'  FAILED' if ran.error else ''}{'  (cached)' if ran.cached else ''}",
                  flush=True)
            return ran
        order = longest_first(paths)
        results = dict(zip(order, pool.map(run, order)))
    return results, time.perf_counter() - start


def build(out: Path, jobs: int, cache: Path | None) -> dict:
    from pygments.formatters import HtmlFormatter
    paths = site_notebooks()
    if not paths[0].exists(): raise SystemExit("nbs/index.ipynb is missing")
    nbs = {p: json.loads(p.read_text()) for p in paths}
    titles = {p: notebook_title(nbs[p]) for p in paths}
    pages = [(page_name(p), short_title(p, titles[p])) for p in paths] + [("api.html", "API reference")]
    results, build_s = run_all(paths, jobs, cache)

    if out.exists(): shutil.rmtree(out)
    (out / "img").mkdir(parents=True)
    (out / "style.css").write_text(STYLE + HtmlFormatter().get_style_defs(".highlight"))
    for i, p in enumerate(paths):
        images: list[tuple[str, bytes]] = []
        body = render_notebook(nbs[p], results[p].outputs, p.stem, images)
        for name, data in images: (out / name).write_bytes(data)
        links = "" if p.stem == "index" else (
            f'<p class="source-links"><a href="{REPO_URL}/blob/main/nbs/{p.name}">notebook source</a>'
            f'<a href="https://colab.research.google.com/github/{REPO_URL.removeprefix("https://github.com/")}/blob/main/nbs/{p.name}">open in Colab</a></p>')
        (out / page_name(p)).write_text(page(titles[p].replace("`", ""), body, pages, page_name(p), pager(pages, i), links))
    (out / "api.html").write_text(page("API reference", render_api(), pages, "api.html", pager(pages, len(pages) - 1)))

    timings = {"chapters": {p.stem: round(results[p].seconds, 1) for p in paths},
               "cached": [p.stem for p in paths if results[p].cached],  # their seconds are from the run that filled it
               "failed": [p.stem for p in paths if results[p].error],
               "execute_wall_s": round(build_s, 1), "jobs": jobs,
               "machine": f"{cpu_name()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"}
    (out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    errors = [results[p].error for p in paths if results[p].error]
    if errors: raise ChapterFailed("\n\n".join(errors))
    return timings


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.exists() else None
    return m.group(1).strip() if m else platform.processor() or platform.machine()


MD = markdown_renderer()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_site")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks run at a time (timings are cleanest at 1)")
    ap.add_argument("--cache", type=Path, help="keep outputs here; reuse them while a notebook and helios/ are unchanged")
    ap.add_argument("--run-only", action="store_true", help="run the notebooks (filling --cache), build no site")
    ap.add_argument("--execute", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.execute: return execute_notebook(args.execute.resolve(), args.to.resolve())
    start = time.perf_counter()
    print(f"running {len(site_notebooks())} notebooks ({args.jobs} at a time):")
    if args.run_only:
        results, wall_s = run_all(site_notebooks(), args.jobs, args.cache)
        errors = [ran.error for ran in results.values() if ran.error]
        if errors: sys.exit("\n\n".join(errors))
        return print(f"every notebook ran, in {wall_s:.0f} s")
    try:
        timings = build(args.out.resolve(), args.jobs, args.cache)
    except ChapterFailed as e:
        sys.exit(f"{e}\n\nthe site is in {args.out}, but the chapters above failed")
    print(f"executed in {timings['execute_wall_s']:.0f} s; site written to {args.out} in {time.perf_counter() - start:.0f} s "
          f"(per-notebook seconds in {args.out / 'timings.json'})")


if __name__ == "__main__":
    main()
