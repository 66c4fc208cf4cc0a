"""`tierproxy restore`: a tier's history into a new cluster, every offset kept (see `restore.run`)."""
