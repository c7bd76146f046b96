"""actpack in the training loops people use, each an optional extra:

    pip install "actpack[transformers]"   # actpack.integrations.transformers
    pip install "actpack[lightning]"      # actpack.integrations.lightning

Each callback runs training under actpack.budget (its arguments, else ACTPACK_CONF) and writes
the run report into the run's output directory. Importing actpack imports none of these
frameworks; importing an integration without its framework raises ImportError naming the extra.
"""
