"""Parses an OpenMetrics exposition (stdin) with the Prometheus project's
Python client, the reference parser, and prints what it read as JSON:
{family: {"type": ..., "unit": ..., "samples": [[name, labels, value], ...]}}.
A parse error exits 1 with the parser's message."""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

text = sys.stdin.read()
try:
    families = {}
    for f in text_string_to_metric_families(text):
        families[f.name] = {
            "type": f.type,
            "unit": f.unit,
            "samples": [[s.name, s.labels, s.value] for s in f.samples],
        }
except Exception as e:  # the parser raises ValueError and friends
    print(f"not valid OpenMetrics: {e}", file=sys.stderr)
    sys.exit(1)
json.dump(families, sys.stdout)
