"""Model weights by version to every host (issue 43): ``sources`` turns model.source into a fetch plan (the
manifest and one plain GET URL per file), ``fetch`` runs deployctl/hostscripts/fetch.py on each host with bounded
fan-out so the bytes go storage -> host, ``keep`` decides which versions a host keeps."""
