"""AWS Lambda entry point of this repository's own template
(`handlers/aws_lambda.handler`, infra/template.yaml); see infra/README.md.

A re-export of the packaged `drainer.aws.lambda_handler.handler`, which is what an
app that installs drainer names instead: this file exists only for a checkout
deployed with infra/stage.py, and must not grow code of its own.
"""

from drainer.aws.lambda_handler import handler

__all__ = ["handler"]
