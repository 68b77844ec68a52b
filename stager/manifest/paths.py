"""Where a dataset's manifest lives, relative to the dataset's root."""

MANIFEST_DIR = ".stager"
MANIFEST_PATH = f"{MANIFEST_DIR}/manifest.parquet"
