// Validate Kubernetes objects against the OpenAPI schemas of their CRDs, as published in the @kubernetes-models
// npm packages (ajv-compiled validators from each project's CRD YAML). Usage: node crdcheck.mjs NODE_MODULES < in
// stdin: JSON [{"module": "<package>/_schemas/<Name>.js", "doc": {...}}, ...]; stdout: JSON [[problem, ...], ...].
// CRD schemas allow unknown fields (the API server prunes them), so strictness comes from watching the validator:
// every field the schema declares is read by it; a field of the document it never reads is not in the schema.
import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";
import path from "node:path";

const root = process.argv[2];
const items = JSON.parse(readFileSync(0, "utf8"));

function track(value, at, seen) {
  if (value === null || typeof value !== "object") return value;
  return new Proxy(value, {
    get(target, key) {
      if (typeof key === "string") seen.add(`${at}/${key}`);
      return track(target[key], `${at}/${key}`, seen);
    },
  });
}

function unread(value, at, seen, out) {
  if (value === null || typeof value !== "object") return;
  for (const key of Object.keys(value)) {
    const here = `${at}/${key}`;
    if (!Array.isArray(value) && !seen.has(here)) out.push(`${here}: field not in the schema`);
    else unread(value[key], here, seen, out);
  }
}

const results = [];
for (const { module, doc } of items) {
  const { validate } = await import(pathToFileURL(path.join(root, module)).href);
  const seen = new Set();
  const problems = [];
  if (!validate(track(doc, "", seen))) {
    for (const e of validate.errors) problems.push(`${e.instancePath || "/"}: ${e.message ?? `${e.keyword} ${JSON.stringify(e.params)}`}`);
  }
  unread(doc, "", seen, problems);
  results.push(problems);
}
process.stdout.write(JSON.stringify(results));
