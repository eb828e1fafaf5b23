#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
The public headers' contract, checked: every KVT_API function has a
comment above it; every one that returns kvt_status_t names, in that
comment, each status it returns (KVT_OK or KVT_INPROGRESS, and each
KVT_ERR_*), and every name is a status of include/kvt/status.h. With
--covered FILE (tests/api/test_api.c), the statuses documented for the
calls that file covers must be exactly those it produces (COVER) or says
it cannot (UNCOVERED), no more and no fewer.

Exits 0 when everything holds, 1 with a list of what does not.
"""
import re, sys, os

def statuses(include):
    text = open(os.path.join(include, 'kvt', 'status.h')).read()
    return {'KVT_' + m for m in re.findall(r'XX\((\w+),', text)}

def functions(include):
    """(name, returns status?, comment, header) of every KVT_API function."""
    out = []
    for f in sorted(os.listdir(os.path.join(include, 'kvt'))):
        if not f.endswith('.h') or f == 'defs.h':  # defs.h defines KVT_API
            continue
        text = open(os.path.join(include, 'kvt', f)).read()
        for m in re.finditer(r'KVT_API\s+([^;(]*?)\b(\w+)\s*\(', text):
            ret, name = m.group(1).strip(), m.group(2)
            before = text[:m.start()].rstrip()
            # A comment may cover several declarations in a row.
            while True:
                last = before.rfind('\n')
                line = before[last + 1:]
                if line.startswith('KVT_API') or (
                        not before.endswith('*/') and
                        re.search(r'KVT_API[^;]*;\s*$', before[-400:])):
                    cut = before.rfind('KVT_API')
                    before = before[:cut].rstrip()
                    continue
                break
            comment = ''
            if before.endswith('*/'):
                comment = before[before.rfind('/*'):]
            out.append((name, ret == 'kvt_status_t', comment, f))
    return out

def flat(comment):
    """The comment's text in one line, from its first "Returns" on: the
    statuses a call returns are listed there (others may be named before
    it, as what a peer sees)."""
    text = re.sub(r'\s*\n\s*\*\s?', ' ', comment)
    m = re.search(r'\bReturns?\b|\breturns?\s+(?=KVT_|what\b)', text)
    return text[m.start():] if m else ''

def documented(comment):
    return set(re.findall(r'\bKVT_(?:OK|INPROGRESS|ERR_[A-Z_]+)\b',
                          flat(comment)))

def references(comment):
    """Calls whose statuses a comment takes over: "as kvt_x() has them",
    "what kvt_x() would return", "as kvt_x() would"."""
    return set(re.findall(r'\b(?:as|what)\s+(kvt_\w+)\(\)', flat(comment)))

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    include = os.path.join(here, '..', '..', 'include')
    covered_file = None
    args = sys.argv[1:]
    if args[:1] == ['--covered']:
        covered_file = args[1]
    valid = statuses(include)
    problems = []
    docs = {}
    refs = {}
    for name, is_status, comment, hdr in functions(include):
        if not comment:
            problems.append('%s (%s): no comment above it' % (name, hdr))
            continue
        names = documented(comment)
        bad = names - valid
        if bad:
            problems.append('%s: names statuses that do not exist: %s' %
                            (name, ', '.join(sorted(bad))))
        if is_status:
            if not any(n.startswith('KVT_ERR_') for n in names) and \
               'KVT_OK' not in names:
                problems.append('%s (%s): returns a status but its comment '
                                'names none' % (name, hdr))
            docs[name] = names & valid
            refs[name] = references(comment)
    # Statuses taken over from the calls a comment refers to.
    for _ in range(4):
        for name in docs:
            for ref in refs.get(name, ()):
                docs[name] |= docs.get(ref, set())
    if covered_file:
        text = open(covered_file).read()
        cov = {}
        for kind, fn, st in re.findall(
                r'\b(COVER|UNCOVERED)\(\s*(\w+)\s*,\s*(KVT_\w+)', text):
            cov.setdefault(fn, set()).add(st)
        # FINAL(b, status) and NOT_HERE(status, why) stand for the three
        # calls that report a descriptor's state, NOT_HERE for
        # kvt_batch_submit_wait() too, and SYNC(e, d, status) for it.
        three = ('kvt_batch_wait', 'kvt_batch_query', 'kvt_batch_entry')
        for st in re.findall(r'\bFINAL\(\s*\w+\s*,\s*(KVT_ERR_\w+)', text):
            for fn in three:
                cov.setdefault(fn, set()).add(st)
        for st in re.findall(r'\bNOT_HERE\(\s*(KVT_ERR_\w+)', text):
            for fn in three + ('kvt_batch_submit_wait',):
                cov.setdefault(fn, set()).add(st)
        for st in re.findall(r'\bSYNC\([^;]*?(KVT_(?:OK|INPROGRESS|ERR_\w+))'
                             r'\s*\)\s*;', text):
            cov.setdefault('kvt_batch_submit_wait', set()).add(st)
        for fn, got in sorted(cov.items()):
            if fn not in docs:
                problems.append('%s: covered by the test but not a public '
                                'call returning a status' % fn)
                continue
            want = docs[fn]
            for s in sorted(want - got):
                problems.append('%s: documents %s, which the test neither '
                                'produces nor explains' % (fn, s))
            for s in sorted(got - want):
                problems.append('%s: returns %s in the test, which its '
                                'comment does not name' % (fn, s))
        for fn in sorted(set(docs) - set(cov)):
            hdrs = [h for n, s, c, h in functions(include) if n == fn]
            if hdrs and hdrs[0] in ('engine.h', 'transfer.h', 'version.h',
                                    'log.h', 'status.h'):
                problems.append('%s (%s): not covered by %s' %
                                (fn, hdrs[0], os.path.basename(covered_file)))
    for p in problems:
        print(p)
    print('%d public calls, %d problems' % (len(functions(include)),
                                            len(problems)))
    return 1 if problems else 0

if __name__ == '__main__':
    sys.exit(main())
