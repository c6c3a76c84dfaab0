"""AWS Lambda entry point (`handlers/aws_lambda.handler`); see infra/README.md.

The function is configured by its environment (DRAINER_TASKS, DATABASE_URL or
DRAINER_DATABASE_SECRET_ARN, ...); everything else is `drainer.aws.function`.
"""

from drainer.aws.function import run_lambda


def handler(event: dict, context: object) -> dict:
    return run_lambda(event, context)
