"""The documentation site's mkdocs hook and griffe extension (mkdocs.yml names both).

The hook, on each page's markdown:

* makes the README the site's home page (``docs/index.md`` stands for it; its title's
  anchor is ``home``, as ``fp8jax`` names the package), its links into ``docs/`` made
  relative to the site;
* makes each link to a file outside the site (``../fp8jax/gemm/recipes.py``,
  ``../scripts/...``, ``docs/perf_raw/...``) a link to the repository's source at
  ``extra.source_url`` (``FP8JAX_SOURCE_URL``, e.g. ``https://github.com/ORG/fp8jax/blob/main``),
  or plain text where it is unset; one to a file the repository lacks is a warning, so it
  fails the ``--strict`` build, as does every link left (into the site) that mkdocs cannot
  resolve, anchors included;
* puts a blank line before a list that starts right under a paragraph line (GitHub reads it
  as a list, Python-Markdown only after a blank line).

The griffe extension (:class:`Fp8jaxLayout`, read by mkdocstrings):

* attaches ``models/`` and ``experiments/`` to the ``fp8jax`` package as ``fp8jax.models``
  and ``fp8jax.experiments``, as ``pyproject.toml`` installs them;
* turns the docstrings' reST roles (``:func:`~fp8jax.quantize` ``) into cross-references
  where griffe finds the object (a link where the site documents it, text otherwise) and
  inline code where it does not, and a paragraph's closing ``::`` into ``:``.
"""

import logging
import pathlib
import posixpath
import re

import griffe

log = logging.getLogger("mkdocs.hooks.docs_site")  # a warning fails the --strict build
REPO = pathlib.Path(__file__).resolve().parents[1]
# Repository folders installed under the fp8jax namespace (pyproject.toml's package-dir).
NAMESPACED = ("models", "experiments")

# [text](target) and ![alt](target), as tests/project/test_docs_links.py reads them.
LINK = re.compile(r"(!?)\[((?:[^\]\[]|\[[^\]]*\])*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)[^`]*?\1")
FENCE_LINE = re.compile(r"^\s*(```|~~~)")
LIST_ITEM = re.compile(r"^ {0,3}(?:[-*+]|1[.)]) +\S")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")


# ---- the mkdocs hook -------------------------------------------------------------------

def _masked(text):
  """``text`` with its code fences and code spans blanked out, at the same offsets."""
  def blank(m):
    return re.sub(r"[^\n]", " ", m.group(0))

  return CODE_SPAN.sub(blank, FENCE.sub(blank, text))


def _rewrite_links(markdown, source, page_dir, files, source_url):
  """Links of the markdown of repository file ``source`` (e.g. ``docs/study.md``), as the
  site page in ``page_dir`` (relative to docs/) sees them."""

  def link(m):
    bang, text, target, title = m.groups()
    if SCHEME.match(target) or target.startswith(("#", "/")):
      return m.group(0)
    path, hash_, anchor = target.partition("#")
    dest = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if dest == "README.md":  # the README is the home page
      dest = "docs/index.md"
    if dest.startswith("docs/"):
      # Into the site: kept (made relative to the page), for mkdocs to check.
      file = files.get_file_from_path(dest[len("docs/"):])
      if file is None or not file.inclusion.is_excluded():
        rel = posixpath.relpath(dest[len("docs/"):], page_dir or ".")
        return f"{bang}[{text}]({rel}{hash_}{anchor}{title})"
    if not (REPO / dest).exists():
      log.warning(f"Doc file '{source}' contains a link '{target}', but the repository has "
                  f"no '{dest}'.")
    if source_url:
      return f"{bang}[{text}]({source_url.rstrip('/')}/{dest}{hash_}{anchor}{title})"
    return text

  # Links are found outside code, but a link's text may hold code: it is kept whole.
  out, pos = [], 0
  for m in LINK.finditer(_masked(markdown)):
    whole = LINK.fullmatch(markdown, m.start(), m.end())
    out += [markdown[pos:m.start()], link(whole) if whole else markdown[m.start():m.end()]]
    pos = m.end()
  out.append(markdown[pos:])
  return "".join(out)


def _breakless_lists(markdown):
  """A blank line before each list that follows a paragraph line, outside code fences: on
  GitHub a list may start right under a paragraph, in Python-Markdown only after a blank."""
  out, fence, prev = [], None, ""
  for line in markdown.split("\n"):
    opening = FENCE_LINE.match(line)
    if fence is None and opening:
      fence = opening.group(1)
    elif fence is not None and line.strip().startswith(fence):
      fence = None
    elif (fence is None and LIST_ITEM.match(line) and prev.strip()
          and not LIST_ITEM.match(prev) and not prev.startswith((" ", "\t"))):
      out.append("")
    out.append(line)
    prev = line
  return "\n".join(out)


def on_page_markdown(markdown, page, config, files, **kwargs):
  src = page.file.src_uri
  source = f"docs/{src}"
  if src == "index.md":  # the home page is the README
    source = "README.md"
    markdown = (REPO / "README.md").read_text(encoding="utf-8")
    # Its title's anchor is "home": "fp8jax" names the package in the API reference.
    markdown = re.sub(r"\A# (.*)", r"# \1 { #home }", markdown)
  source_url = config["extra"].get("source_url") or ""
  markdown = _rewrite_links(markdown, source, posixpath.dirname(src), files, source_url)
  return _breakless_lists(markdown)


# ---- the griffe extension --------------------------------------------------------------

ROLE = re.compile(r":(?:mod|class|func|data|attr|meth|obj|exc|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"``.+?``", flags=re.S)
LITERAL_BLOCK = re.compile(r"(\S)::$", flags=re.M)


def _lookup(collection, path):
  """The object at ``path`` in the loaded packages, or None."""
  try:
    return collection[path]
  except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
    return None


def _target(obj, name, collection):
  """The identifier of the object that ``name`` names in the scope of ``obj``, or None."""
  first, _, rest = name.partition(".")
  try:
    base = name if first == "fp8jax" else obj.resolve(first)
  except griffe.NameResolutionError:
    return None
  path = base if first == "fp8jax" or not rest else f"{base}.{rest}"
  found = _lookup(collection, path)
  if found is None:
    return None
  try:
    return found.final_target.path if found.is_alias else found.path
  except (griffe.AliasResolutionError, griffe.CyclicAliasError):
    return path


def _roles_to_refs(obj, collection):
  def ref(m):
    short, name = m.groups()
    name = name.strip().removesuffix("()")
    title = name.rsplit(".", 1)[-1] if short else name
    target = _target(obj, name, collection)
    if target is None:
      return f"`{title}`"
    # Optional: a link where the site documents the object, its title otherwise.
    return f'<autoref identifier="{target}" optional>`{title}`</autoref>'

  text = obj.docstring.value
  literals = [m.span() for m in LITERAL.finditer(text)]  # a role inside ``...`` is kept
  out, pos = [], 0
  for m in ROLE.finditer(text):
    if not any(a <= m.start() < b for a, b in literals):
      out += [text[pos:m.start()], ref(m)]
      pos = m.end()
  out.append(text[pos:])
  obj.docstring.value = LITERAL_BLOCK.sub(r"\1:", "".join(out))


def _walk(obj):
  yield obj
  for member in obj.members.values():
    if not member.is_alias:
      yield from _walk(member)


class Fp8jaxLayout(griffe.Extension):
  """``fp8jax.models`` and ``fp8jax.experiments`` from their folders; reST roles as
  cross-references."""

  def on_package(self, *, pkg, loader, **kwargs):
    if pkg.name != "fp8jax":
      return
    for name in NAMESPACED:
      # Found on the search path (the repository's root) as a package of its own, then
      # made a member of fp8jax: its objects' paths become fp8jax.NAME...
      pkg.set_member(name, loader.load(name))
    for obj in _walk(pkg):
      if obj.docstring is not None:
        _roles_to_refs(obj, loader.modules_collection)
