#!/usr/bin/python3
"""unigram_loss.py: the loss of a model without context on the tool's validation split.

The byte frequencies of the training split scored on the validation split, in nats per byte,
with the split rebuilt as `performer train` makes it (src/io/text.c, src/model/data.c): the data
cut into documents, each validation when its hash (pf_doc_hash) maps below the fraction.

    /usr/bin/python3 scripts/unigram_loss.py bible build/RUN/bible-kjv.txt [FRACTION]
    /usr/bin/python3 scripts/unigram_loss.py proteins /usr/share/doc/mmseqs2/example-data/DB.fasta.gz

Standard library only; the functions are for the other scripts too."""
import collections
import gzip
import math
import sys

M64 = (1 << 64) - 1


def documents(raw, kind):
    """The documents of a file as the tool cuts them: FASTA records (their residues, then a line
    end) for proteins; for text, pieces ending at the first line end after 2048 bytes."""
    docs = []
    if kind == "proteins":
        cur = []
        for line in raw.split(b"\n"):
            if line.startswith(b">"):
                if cur:
                    docs.append(b"".join(cur) + b"\n")
                cur = []
            elif line.strip():
                cur.append(line.strip())
        if cur:
            docs.append(b"".join(cur) + b"\n")
        return docs
    s = 0
    for i, ch in enumerate(raw):
        if ch == 10 and (i + 1 - s >= 2048 or i + 1 == len(raw)):
            docs.append(raw[s:i + 1])
            s = i + 1
    return docs


def doc_hash(b):
    """pf_doc_hash: FNV-1a 64, then splitmix64's finaliser."""
    h = 14695981039346656037
    for x in b:
        h = ((h ^ x) * 1099511628211) & M64
    h ^= h >> 30
    h = (h * 0xbf58476d1ce4e5b9) & M64
    h ^= h >> 27
    h = (h * 0x94d049bb133111eb) & M64
    return h ^ (h >> 31)


def is_validation(doc, fraction):
    return (doc_hash(doc) >> 11) * 2.0 ** -53 < fraction


def unigram_loss(path, kind, fraction=0.05):
    """Cross-entropy (nats/byte) of the training split's byte frequencies on the validation
    split."""
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    train, val = collections.Counter(), collections.Counter()
    for d in documents(raw, kind):
        (val if is_validation(d, fraction) else train).update(d)
    nt, nv = sum(train.values()), sum(val.values())
    return -sum(c / nv * math.log(train[b] / nt) for b, c in val.items())


def main(argv):
    if len(argv) not in (3, 4) or argv[1] not in ("bible", "proteins", "text"):
        sys.stderr.write("usage: unigram_loss.py bible|proteins|text FILE [FRACTION]\n")
        return 2
    kind = "proteins" if argv[1] == "proteins" else "text"
    print("%.4f" % unigram_loss(argv[2], kind, float(argv[3]) if len(argv) == 4 else 0.05))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
