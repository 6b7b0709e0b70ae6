"""The documentation's relative links lead somewhere: every `[text](path#anchor)` in the
README, docs/, benchmarks/ and experiments/ names a file of the checkout and, where it has
an anchor, a heading of that file (GitHub's slugs), so that moving text between pages cannot
leave a newcomer at a dead link."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / 'README.md', *ROOT.glob('docs/*.md'), *ROOT.glob('benchmarks/*.md'),
                *ROOT.glob('experiments/*.md')])
_LINK = re.compile(r'\]\(([^)\s]+)\)')
_FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def slug(heading: str) -> str:
  """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to '-'."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(page: Path) -> set[str]:
  """The anchors of a markdown page's headings (outside code blocks)."""
  text = _FENCE.sub('', page.read_text())
  return {slug(line.lstrip('#')) for line in text.splitlines() if re.match(r'#{1,6} ', line)}


def broken_links(page: Path) -> list[str]:
  """The relative links of `page` whose file or heading does not exist."""
  broken = []
  for link in _LINK.findall(_FENCE.sub('', page.read_text())):
    if re.match(r'[a-z]+:', link):  # http:, https:, mailto:
      continue
    path, _, anchor = link.partition('#')
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
      broken.append(f'{link}: no file {os.path.relpath(target, ROOT)}')
    elif anchor and target.suffix == '.md' and anchor not in anchors(target):
      broken.append(f'{link}: no heading #{anchor} in {target.name}')
  return broken


def test_slugs_follow_github():
  assert slug(' How `tx tune` chooses') == 'how-tx-tune-chooses'
  assert slug("What tx's CPU defaults are worth") == 'what-txs-cpu-defaults-are-worth'
  assert slug('Hugging Face checkpoints (`tx.interop`)') == 'hugging-face-checkpoints-txinterop'


def test_a_dead_link_is_found(tmp_path):
  page = tmp_path / 'page.md'
  (tmp_path / 'there.md').write_text('# Here\n')
  page.write_text('[a](there.md#here) [b](there.md#gone) [c](missing.md) [d](https://x.org)\n'
                  '```\n[e](in_code.md)\n```\n')
  found = [line.split(':')[0] for line in broken_links(page)]
  assert found == ['there.md#gone', 'missing.md']


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
  broken = broken_links(page)
  assert not broken, broken
