#!/usr/bin/python3
"""bench_cli.py: what the `performer attn` command costs around the library's own work.

    /usr/bin/python3 bench/bench_cli.py [build/performer] [--repeats N]

Runs `performer attn --timings` on .npy inputs in a scratch folder, N times each, and prints
medians: the whole process (fork to exit, measured here), the time inside the library (the
tool's "compute" figure), and the tool's reading and writing. Two sizes: B=1, H=8, L=4096,
d=64 (FAVOR+ bidirectional and exact), whose whole process should take at most 2x the
library's time, and a tiny (1, 4, 4) input, whose whole process is the tool's fixed cost
(target: under 10 ms). All ratios come from the same run (the machine is shared and noisy).
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return 'unknown CPU'


def run(cmd, repeats):
    """Medians (ms) of the whole process and of the tool's read, compute and write figures."""
    wall, parts = [], {'read': [], 'compute': [], 'write': []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall.append((time.perf_counter() - t0) * 1e3)
        if r.returncode != 0:
            sys.exit('bench_cli: %s failed: %s' % (' '.join(cmd), r.stderr.strip()))
        m = re.search(r'read and check ([\d.]+) ms, compute ([\d.]+) ms, write ([\d.]+) ms',
                      r.stderr)
        if not m:
            sys.exit('bench_cli: no --timings line in: ' + r.stderr)
        for k, v in zip(('read', 'compute', 'write'), m.groups()):
            parts[k].append(float(v))
    return statistics.median(wall), {k: statistics.median(v) for k, v in parts.items()}


def main():
    args = sys.argv[1:]
    perf = 'build/performer'
    repeats = 15
    i = 0
    while i < len(args):
        if args[i] == '--repeats':
            repeats = int(args[i + 1])
            i += 2
        else:
            perf = args[i]
            i += 1
    perf = os.path.abspath(perf)
    version = subprocess.run([perf, '--version'], capture_output=True, text=True).stdout.strip()
    print('# bench_cli: the performer command around the library (medians of %d runs)' % repeats)
    print('# CPU: %s, %d cores; %s' % (cpu_name(), os.cpu_count(), version))
    with tempfile.TemporaryDirectory(prefix='pf_bench_cli.') as d:
        g = np.random.default_rng(0)
        for name, shape in (('big', (1, 8, 4096, 64)), ('tiny', (1, 4, 4))):
            for x in 'qkv':
                np.save(os.path.join(d, '%s_%s.npy' % (name, x)),
                        g.standard_normal(shape, dtype=np.float32))
        print('%-34s %10s %10s %10s %10s %12s' % ('case', 'process', 'library', 'read', 'write',
                                                   'process/lib'))
        cases = [('B=1 H=8 L=4096 d=64, favor', 'big', []),
                 ('B=1 H=8 L=4096 d=64, favor causal', 'big', ['--causal']),
                 ('B=1 H=8 L=4096 d=64, exact', 'big', ['--method', 'exact']),
                 ('(1, 4, 4): the fixed cost', 'tiny', [])]
        for label, name, extra in cases:
            io = ['--q', os.path.join(d, name + '_q.npy'), '--k', os.path.join(d, name + '_k.npy'),
                  '--v', os.path.join(d, name + '_v.npy'), '--out', os.path.join(d, 'o.npy')]
            cmd = [perf, 'attn'] + io + extra + ['--timings']
            run(cmd, 2)  # warm the page cache and the binary
            wall, p = run(cmd, repeats)
            print('%-34s %8.1f ms %7.1f ms %7.1f ms %7.1f ms %11.2fx' %
                  (label, wall, p['compute'], p['read'], p['write'], wall / max(p['compute'], 1e-3)))


main()
