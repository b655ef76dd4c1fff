from support.s3store import s3  # noqa: F401  (the moto server fixture)
