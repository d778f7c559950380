"""The demo model: a small byte-level Llama trained on Ambrose Bierce's "The Devil's
Dictionary" (public domain), in the layout both engines serve. corpus.py reads the text,
model.py is the architecture and its files, train.py the deterministic recipe that
scripts/train-demo-model runs. Needs PyTorch (Debian's python3-torch for /usr/bin/python3)."""
