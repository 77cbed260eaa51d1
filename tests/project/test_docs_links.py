"""Every relative link in README.md and the markdown pages under docs/ (subfolders
included) points at a file of the repository, and every #anchor into a markdown page names
one of its headings."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
TOP_PAGES = sorted((REPO / "docs").glob("*.md"))
SUB_PAGES = sorted(p for p in (REPO / "docs").rglob("*.md") if p.parent != REPO / "docs")
PAGES = [REPO / "README.md", *TOP_PAGES, *SUB_PAGES]
# [text](target) and ![alt](target); the text may span lines, the target may not.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*```.*?^\s*```", flags=re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _slug(heading):
  """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
  text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page):
  text = FENCE.sub("", page.read_text())
  slugs, seen = set(), {}
  for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M):
    slug = _slug(heading)
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    slugs.add(slug if n == 0 else f"{slug}-{n}")
  return slugs


def _links(page):
  text = FENCE.sub("", page.read_text())
  text = CODE_SPAN.sub("", text)
  return [m.group(1) for m in LINK.finditer(text)]


def test_relative_links_resolve():
  broken = []
  for page in PAGES:
    for target in _links(page):
      if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        continue
      path, _, anchor = target.partition("#")
      dest = (page.parent / path).resolve() if path else page
      where = f"{page.relative_to(REPO)}: {target}"
      if not dest.exists():
        broken.append(f"{where} (no such file)")
      elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        broken.append(f"{where} (no such heading)")
  assert not broken, "broken links:\n" + "\n".join(broken)


def _linked_from(page):
  return {(page.parent / t.partition("#")[0]).resolve() for t in _links(page)
          if not re.match(r"^[a-z][a-z0-9+.-]*:", t)}


def test_pages_link_to_something():
  """The README links every docs page, so none is orphaned (but docs/index.md, the
  documentation site's home page, which is the README itself)."""
  linked = _linked_from(REPO / "README.md")
  orphans = [p.name for p in TOP_PAGES if p.resolve() not in linked and p.name != "index.md"]
  assert not orphans, f"docs pages the README does not link: {orphans}"


def test_subfolder_pages_are_linked():
  """Each page in a subfolder of docs/ (e.g. every archived performance set) is linked from
  another page, so none is orphaned."""
  links = {p.resolve(): _linked_from(p) for p in PAGES}
  orphans = [str(p.relative_to(REPO)) for p in SUB_PAGES
             if not any(p.resolve() in to for page, to in links.items() if page != p.resolve())]
  assert not orphans, f"docs pages no other page links: {orphans}"
