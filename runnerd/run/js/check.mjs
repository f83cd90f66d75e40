// Upload-time checks of JavaScript and TypeScript tools. Never runs the tools' code.
//
// argv[2]: the toolchain folder (its node_modules holds esbuild and the two lexers).
// stdin:   JSON [{path, language, source}]
// stdout:  JSON [{path, errors: [{line, column, text}], code?, commonjs?, format?, exports?,
//                 imports?}]
//
// TypeScript is compiled to ES module JavaScript with an inline source map, so stack
// traces name the lines of the .ts file. JavaScript is only parsed: its source runs as is.
// An ES module (JavaScript or TypeScript) that imports nothing but Node's builtins is also
// compiled to CommonJS (`commonjs`), in strict mode, with an inline source map: a jail
// loads that with require, without Node's ES module loader (about 4 ms of a cold start).
// Not when the module needs the loader: top-level await, import.meta, packages.
import { builtinModules, createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import { compileFunction } from 'node:vm';

const require = createRequire(process.argv[2].replace(/\/?$/, '/'));
const esbuild = require('esbuild');
const esLexer = require('es-module-lexer');
const cjsLexer = require('cjs-module-lexer');

await esLexer.init;
cjsLexer.initSync();

const BUILTINS = new Set(builtinModules);
const REQUIRE_CALL = /\brequire\s*\(\s*(['"])([^'"\n]+)\1\s*\)/g;
const MODULE_EXPORTS_ASSIGN = /\bmodule\s*\.\s*exports\s*=(?!=)/;

const WRAPPER = ['exports', 'require', 'module', '__filename', '__dirname'];

// esbuild's transform of one source, for Node 20, with these options on top.
function transform(file, typescript, options) {
  return esbuild.transformSync(file.source, {
    loader: typescript ? 'ts' : 'js',
    sourcefile: file.path,
    target: 'node20',
    sourcesContent: false,
    logLevel: 'silent',
    ...options,
  });
}

function commonjs(file, typescript) {
  let out;
  try {
    out = transform(file, typescript, {
      format: 'cjs',
      banner: '"use strict";', // an ES module is strict code: so is what stands for it
      sourcemap: 'inline',
    });
  } catch {
    return null; // top-level await
  }
  if (out.warnings.length) return null; // import.meta, which CommonJS cannot give
  try {
    compileFunction(out.code, WRAPPER, { filename: file.path }); // compiled, never run
  } catch {
    return null;
  }
  return out.code;
}

function check(file) {
  const typescript = file.language === 'typescript';
  let code;
  try {
    code = transform(file, typescript, { sourcemap: typescript ? 'inline' : false }).code;
  } catch (err) {
    const errors = (err.errors || [{ text: String(err) }]).map((e) => ({
      line: e.location ? e.location.line : null,
      column: e.location ? e.location.column + 1 : null,
      text: e.text,
    }));
    return { path: file.path, errors };
  }
  const [imports, exports, , hasModuleSyntax] = esLexer.parse(code);
  const esm = hasModuleSyntax || file.path.endsWith('.mjs') || file.path.endsWith('.mts');
  const specifiers = imports.map((i) => i.n).filter((n) => typeof n === 'string');
  let names;
  if (esm) {
    names = exports.map((e) => e.n);
  } else {
    names = cjsLexer.parse(code).exports;
    // `module.exports = fn` makes the whole module the default export.
    if (MODULE_EXPORTS_ASSIGN.test(code)) names.push('default');
    for (const m of code.matchAll(REQUIRE_CALL)) specifiers.push(m[2]);
  }
  // Only what the sandbox must provide: relative paths and packages, not Node's builtins.
  const needed = [...new Set(specifiers)].filter(
    (s) => !s.startsWith('node:') && !BUILTINS.has(s) && !BUILTINS.has(s.split('/')[0]),
  );
  return {
    path: file.path,
    errors: [],
    code: typescript ? code : null,
    commonjs: esm && needed.length === 0 ? commonjs(file, typescript) : null,
    format: esm ? 'esm' : 'cjs',
    exports: [...new Set(names)],
    imports: needed,
  };
}

const files = JSON.parse(readFileSync(0, 'utf8'));
process.stdout.write(JSON.stringify(files.map(check)));
