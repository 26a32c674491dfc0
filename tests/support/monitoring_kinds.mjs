// Validates Prometheus Operator objects (JSON lines on stdin) against the operator's CRD schemas,
// with @kubernetes-models/prometheus-operator's own validation; prints one JSON line per object:
// {"kind", "name", "error"} (error null when valid). Run from the folder it is installed in
// (tests/support/monitoring_kinds.py passes this file to `node --input-type=module -e`).
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { createInterface } from "node:readline";

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const object = JSON.parse(line);
  const Model = v1[object.kind];
  let error = null;
  if (!Model || object.apiVersion !== "monitoring.coreos.com/v1") {
    error = `not a monitoring.coreos.com/v1 kind: ${object.apiVersion} ${object.kind}`;
  } else {
    try {
      new Model(object).validate();
    } catch (caught) {
      error = caught.message;
    }
  }
  console.log(JSON.stringify({ kind: object.kind, name: object.metadata?.name, error }));
}
