"""drainer on AWS (the `aws` extra): the Lambda function's run and the producer's kick.

Nothing here is imported by the command line: boto3 costs a few hundred
milliseconds of start-up, so only these modules import it, and only when they
first need a client.

- `lambda_handler.handler(event, context)`: the function's entry point, the handler
  string `drainer.aws.lambda_handler.handler` (shipped in the package, so an app
  that installs drainer deploys it; `handlers/aws_lambda.py` re-exports it).
- `function.run_lambda(event, context)`: the run it calls.
- `kick.Kicker`: invoke the drainer function right after an enqueue commits.
- `credentials`: DATABASE_URL, a Secrets Manager secret, or RDS IAM tokens.
- `schedule`: one-time EventBridge Scheduler wake-ups for the next due minute.
"""
