#!/usr/bin/env bash
# Deploy drainer from this checkout as a Cloud Run function (Functions Framework),
# with its service accounts, the database URL in Secret Manager, a Cloud Tasks
# queue for wake-ups and continuations, and a Cloud Scheduler backstop.
# See infra/gcp/README.md. Safe to run again: what exists is kept, the function
# is deployed anew.
#
#   PROJECT=my-project REGION=europe-west1 TASKS=myapp.tasks \
#   DATABASE_URL='postgresql://...' infra/gcp/deploy.sh
set -euo pipefail

: "${PROJECT:?set PROJECT, the Google Cloud project}"
: "${REGION:?set REGION, e.g. europe-west1}"
: "${TASKS:?set TASKS, the modules with your @task handlers (e.g. myapp.tasks)}"
FUNCTION=${FUNCTION:-drainer}
QUEUE=${QUEUE:-drainer-wakeups}
SECRET=${SECRET:-drainer-database-url}
TIMEOUT=${TIMEOUT:-540}               # seconds: the function's, and DRAINER_FUNCTION_TIMEOUT
BACKSTOP=${BACKSTOP:-'0 */6 * * *'}   # less often than the database suspends
RUNNER=drainer-run@$PROJECT.iam.gserviceaccount.com       # the function runs as it
INVOKER=drainer-invoker@$PROJECT.iam.gserviceaccount.com  # Scheduler and Tasks call as it

cd "$(dirname "$0")/../.."
g() { gcloud --project "$PROJECT" --quiet "$@"; }

g services enable cloudfunctions.googleapis.com run.googleapis.com \
  cloudbuild.googleapis.com artifactregistry.googleapis.com cloudtasks.googleapis.com \
  cloudscheduler.googleapis.com secretmanager.googleapis.com

# Service accounts: one the function runs as, one that calls it.
for account in drainer-run drainer-invoker; do
  g iam service-accounts describe "$account@$PROJECT.iam.gserviceaccount.com" >/dev/null 2>&1 ||
    g iam service-accounts create "$account" --display-name "drainer: $account"
done
# The function creates tasks that carry the invoker's token: it acts as the invoker.
g iam service-accounts add-iam-policy-binding "$INVOKER" \
  --member "serviceAccount:$RUNNER" --role roles/iam.serviceAccountUser

# The database URL, a secret only the function reads (DATABASE_URL given once).
if ! g secrets describe "$SECRET" >/dev/null 2>&1; then
  : "${DATABASE_URL:?set DATABASE_URL once, to create the secret $SECRET}"
  printf '%s' "$DATABASE_URL" | g secrets create "$SECRET" --data-file=-
fi
g secrets add-iam-policy-binding "$SECRET" \
  --member "serviceAccount:$RUNNER" --role roles/secretmanager.secretAccessor

# Wake-ups and continuations: tasks the function creates, lists and deletes.
g tasks queues describe "$QUEUE" --location "$REGION" >/dev/null 2>&1 ||
  g tasks queues create "$QUEUE" --location "$REGION" --max-attempts 3 --min-backoff 10s
for role in roles/cloudtasks.enqueuer roles/cloudtasks.taskDeleter roles/cloudtasks.viewer; do
  g tasks queues add-iam-policy-binding "$QUEUE" --location "$REGION" \
    --member "serviceAccount:$RUNNER" --role "$role"
done

# The function's code: drainer/, handlers/, the task modules' packages, and the
# requirements with the gcp extra's libraries.
python3 infra/stage.py ${TASKS//,/ } --out build/gcp
python3 - >>build/gcp/requirements.txt <<'PY'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gcp"]))
PY

# Its URL, known before the first deploy (wake-ups are addressed to it).
NUMBER=$(g projects describe "$PROJECT" --format 'value(projectNumber)')
URL=https://$FUNCTION-$NUMBER.$REGION.run.app
g functions deploy "$FUNCTION" --gen2 --region "$REGION" --runtime python312 \
  --source build/gcp --set-build-env-vars GOOGLE_FUNCTION_SOURCE=handlers/gcp.py \
  --entry-point drain_http --trigger-http --no-allow-unauthenticated \
  --timeout "$TIMEOUT" --service-account "$RUNNER" \
  --set-env-vars "^;^DRAINER_TASKS=$TASKS;DRAINER_FUNCTION_TIMEOUT=$TIMEOUT;DRAINER_DATABASE_SECRET=projects/$PROJECT/secrets/$SECRET;DRAINER_TASKS_QUEUE=projects/$PROJECT/locations/$REGION/queues/$QUEUE;DRAINER_WAKE_URL=$URL;DRAINER_TASKS_SERVICE_ACCOUNT=$INVOKER"
g functions add-invoker-policy-binding "$FUNCTION" --region "$REGION" \
  --member "serviceAccount:$INVOKER"

# The backstop: a POST every so often, with the invoker's token.
job=(--location "$REGION" --schedule "$BACKSTOP" --time-zone UTC --uri "$URL"
     --http-method POST --headers Content-Type=application/json
     --message-body '{"source": "drainer.cron"}' --attempt-deadline "${TIMEOUT}s"
     --oidc-service-account-email "$INVOKER" --oidc-token-audience "$URL")
g scheduler jobs describe "$FUNCTION-backstop" --location "$REGION" >/dev/null 2>&1 ||
  g scheduler jobs create http "$FUNCTION-backstop" "${job[@]}"

echo "deployed $URL; apply the schema once (you need roles/run.invoker on it):"
echo "  curl -X POST -H \"Authorization: Bearer \$(gcloud auth print-identity-token)\" \\"
echo "    -H 'Content-Type: application/json' -d '{\"source\": \"drainer.migrate\"}' $URL"
