#!/usr/bin/env python3
"""The shape of a crate's source, for keeping the node crate livable: the longest functions,
the largest files (lines before their `#[cfg(test)] mod tests`; `tests.rs` files count as
tests) and the structs with the most fields. A rough reader (brace counting), not a parser.

Usage: python3 scripts/node-shape.py [node/src]
"""
import re, sys, os
root = sys.argv[1] if len(sys.argv) > 1 else 'node/src'
fns, files, structs = [], [], []
for dp, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f)
        lines = open(p).read().split('\n')
        # cut at #[cfg(test)] mod tests
        end = len(lines)
        for i, l in enumerate(lines):
            if l.startswith('#[cfg(test)]') and i + 1 < len(lines) and re.match(r'\s*mod tests', lines[i+1]):
                end = i; break
        if f == 'tests.rs' or '/tests/' in p: 
            files.append((0, p, end)); continue
        files.append((end, p, len(lines)))
        i = 0
        while i < end:
            l = lines[i]
            m = re.match(r'^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?(unsafe )?fn (\w+)', l)
            sm = re.match(r'^(\s*)(pub(\([a-z]+\))? )?struct (\w+) *\{', l)
            if m:
                ind = m.group(1)
                j = i
                # find line with opening brace
                while j < end and '{' not in lines[j] and not lines[j].rstrip().endswith(';'):
                    j += 1
                if j < end and lines[j].rstrip().endswith(';'):
                    i = j + 1; continue
                depth = 0; k = j
                while k < end:
                    depth += lines[k].count('{') - lines[k].count('}')
                    if depth <= 0 and k >= j: break
                    k += 1
                fns.append((k - i + 1, p, m.group(7), i + 1))
            if sm:
                ind = sm.group(1); k = i + 1; n = 0
                while k < end and not re.match(r'^' + ind + r'\}', lines[k]):
                    if re.match(r'^\s*(pub(\([a-z]+\))? )?\w+: ', lines[k]): n += 1
                    k += 1
                structs.append((n, p, sm.group(4)))
            i += 1
fns.sort(reverse=True); files.sort(reverse=True); structs.sort(reverse=True)
print('functions over 80 lines:', sum(1 for f in fns if f[0] > 80))
for f in fns[:15]: print('  fn %4d  %s:%d %s' % (f[0], f[1], f[3], f[2]))
print('files over 600 non-test lines:', sum(1 for f in files if f[0] > 600))
for f in files[:12]: print('  file %4d (of %d) %s' % (f[0], f[2], f[1]))
print('largest structs:')
for s in structs[:8]: print('  %3d fields %s %s' % s)
