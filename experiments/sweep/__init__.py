"""`ferry sweep`: many runs from one sweep file, in parallel, resumable, into one Parquet table."""
