"""Write the synthetic corpus of the FSDP example: ``tokens.npz`` with ``tokens`` (int64, n x 33),
sequences of a fixed random Markov chain over 64 tokens, so that a small language model can learn
the next token (its best loss is the chain's entropy, well below uniform's ln 64 = 4.16).

Usage: ``python make_data.py [--sequences 2048] [--out tokens.npz]`` (needs only numpy).
"""

from __future__ import annotations

import argparse

import numpy as np

VOCAB = 64
LENGTH = 33  # 32 positions to predict
BRANCHES = 4  # each token is followed by one of 4 tokens: the chain's entropy is at most ln 4


def synthetic(sequences: int, seed: int = 0) -> np.ndarray:
    """``sequences`` walks of one Markov chain (the same chain for every seed)."""
    chain = np.random.default_rng(1234)
    successors = np.stack([chain.choice(VOCAB, size=BRANCHES, replace=False) for _ in range(VOCAB)])
    weights = chain.dirichlet(np.ones(BRANCHES), size=VOCAB)
    rng = np.random.default_rng(seed)
    out = np.empty((sequences, LENGTH), dtype=np.int64)
    out[:, 0] = rng.integers(0, VOCAB, size=sequences)
    for t in range(1, LENGTH):
        previous = out[:, t - 1]
        pick = np.array([rng.choice(BRANCHES, p=weights[p]) for p in previous])
        out[:, t] = successors[previous, pick]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="tokens.npz")
    args = parser.parse_args()
    tokens = synthetic(args.sequences, args.seed)
    np.savez(args.out, tokens=tokens)
    print(f"wrote {args.out}: {len(tokens)} sequences of {LENGTH} tokens over a vocabulary of {VOCAB}")


if __name__ == "__main__":
    main()
