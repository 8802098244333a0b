"""Clip files: what a clip holds and how a depth clip is written, below the layers that ask (see `clips`)."""
