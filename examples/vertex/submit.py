#!/usr/bin/env python3
"""Submit a reduction-server CustomJob to Vertex AI with the google-cloud-aiplatform SDK.

    pip install google-cloud-aiplatform            # beside reduction-server (a clone or its wheel)
    gcloud auth application-default login
    python examples/vertex/submit.py --project my-project --region us-central1 \
        --bucket gs://my-bucket [--config examples/vertex/custom_job.yaml]

The config is the CustomJobSpec written by `reduction-server vertex-job` (the same file
`gcloud ai custom-jobs create --config` takes). --dry-run parses and prints it without
contacting Google Cloud.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "custom_job.yaml")


def _require_aiplatform() -> Any:
    try:
        from google.cloud import aiplatform
    except ImportError:
        sys.exit("submit.py needs the Vertex AI SDK: pip install google-cloud-aiplatform")
    return aiplatform


def load_worker_pool_specs(path: str) -> List[Any]:
    """Read the YAML/JSON CustomJobSpec and return its pools as aiplatform_v1 WorkerPoolSpec."""
    import yaml

    with open(path, "r", encoding="utf-8") as fh:
        spec: Dict[str, Any] = yaml.safe_load(fh)
    if not isinstance(spec, dict) or "workerPoolSpecs" not in spec:
        sys.exit(f"{path}: expected a CustomJobSpec with a top-level workerPoolSpecs list")
    _require_aiplatform()
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    # from_json validates every field name and enum value, offline.
    return list(CustomJobSpec.from_json(json.dumps(spec)).worker_pool_specs)


def _compact(pool: Any) -> str:
    """A pool as camelCase JSON with enum names and without the fields left at their defaults."""
    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(type(pool).pb(pool)))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", required=True, help="Google Cloud project id")
    p.add_argument("--region", required=True, help="Vertex AI region, e.g. us-central1")
    p.add_argument("--bucket", required=True, help="staging bucket, gs://...")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="CustomJobSpec YAML/JSON (default: %(default)s)")
    p.add_argument("--display-name", default="reduction-server-job")
    p.add_argument("--service-account", default=None)
    p.add_argument("--network", default=None,
                   help="VPC network, projects/NUMBER/global/networks/NAME (optional)")
    p.add_argument("--no-wait", action="store_true", help="return once the job is created")
    p.add_argument("--dry-run", action="store_true", help="parse and print the spec, submit nothing")
    args = p.parse_args(argv)

    if not args.bucket.startswith("gs://"):
        p.error("--bucket must be a gs:// URI")
    pools = load_worker_pool_specs(args.config)
    counts = [pool.replica_count for pool in pools]
    print(f"{args.config}: replicas per pool {counts} "
          f"(primary, workers, reducers{', evaluators' if len(pools) > 3 else ''})")
    if args.dry_run:
        for i, pool in enumerate(pools):
            print(f"pool {i}: {_compact(pool)}")
        return 0

    aiplatform = _require_aiplatform()
    aiplatform.init(project=args.project, location=args.region, staging_bucket=args.bucket)
    job = aiplatform.CustomJob(display_name=args.display_name, worker_pool_specs=pools)
    job.run(service_account=args.service_account, network=args.network, sync=not args.no_wait)
    print(f"job: {job.resource_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
