"""The example app: the code its Lambda function runs (template.yaml's CodeUri)."""
