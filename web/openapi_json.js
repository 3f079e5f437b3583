// openapi_json.js - build-time converter: api/openapi.yaml to the JSON that
// trainyardd serves at /v1/openapi.json (YAML read by js-yaml, installed by
// `npm ci` from web/package-lock.json).
//
//   node openapi_json.js IN.yaml OUT.json      (NODE_PATH: the npm folder)
//
// Any failure names the file and exits 1, so the build stops rather than
// embedding a broken document.
'use strict';

const fs = require('node:fs');
const yaml = require('js-yaml');

function main(argv) {
  if (argv.length !== 2) {
    console.error('usage: node openapi_json.js IN.yaml OUT.json');
    return 2;
  }
  const [input, output] = argv;
  let doc;
  try {
    // The JSON schema of js-yaml: plain JSON types only (no dates, no
    // custom tags), so the document reads the same in every YAML reader.
    doc = yaml.load(fs.readFileSync(input, 'utf8'), { filename: input, schema: yaml.JSON_SCHEMA });
  } catch (e) {
    console.error('openapi_json: ' + input + ': ' + e.message);
    return 1;
  }
  if (!doc || typeof doc.openapi !== 'string' || typeof doc.paths !== 'object') {
    console.error('openapi_json: ' + input + ': not an OpenAPI document (no openapi or paths key)');
    return 1;
  }
  // Written whole to a neighbour, then renamed: a failed write never leaves
  // a truncated document for the embedder.
  const tmp = output + '.tmp';
  fs.writeFileSync(tmp, JSON.stringify(doc) + '\n');
  fs.renameSync(tmp, output);
  return 0;
}

process.exitCode = main(process.argv.slice(2));
