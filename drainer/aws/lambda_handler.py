"""The AWS Lambda entry point that ships in the package:
`Handler: drainer.aws.lambda_handler.handler`.

It lives in the package, not in a file of this repository, so that an app which
installs drainer from PyPI (its requirements.txt, packaged by `sam build`) names
it in its own template and deploys with its own code only; examples/aws-app/ is
such an app. The string resolves as the Lambda runtime and awslambdaric resolve
any handler: the module before the last dot, imported from the task root or the
installed packages, and the function after it.

The module is imported on every cold start, so it imports the function's run
and nothing else: no command line, no embedded database, and no boto3 until the
run's first AWS call. The run is configured by the environment (DRAINER_TASKS,
DATABASE_URL or DRAINER_DATABASE_SECRET_ARN, ...; see infra/README.md).
"""

from typing import Any

from .function import run_lambda


def handler(event: Any, context: Any) -> dict[str, object]:
    """One invocation: drain for the trigger `event` stands for within `context`'s
    remaining time, and return the run's summary and what it did next."""
    return run_lambda(event, context)
