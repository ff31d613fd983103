// Shared helpers of the Node test suite: find the built `fern` binary, start `fern serve` on a free port with the
// demo model, and make clients of the official `openai` package (third_party/npm/node_modules).
import { spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

const openaiModule = await import(pathToFileURL(join(ROOT, 'third_party/npm/node_modules/openai/index.mjs')).href);
export const OpenAI = openaiModule.default;

export function findBinary() {
  if (process.env.FERN_BIN) return process.env.FERN_BIN;
  for (const d of ['build', ...readdirSync(ROOT).filter((n) => n.startsWith('build-')).sort()]) {
    const p = join(ROOT, d, 'fern');
    if (existsSync(p)) return p;
  }
  throw new Error('fern binary not found: build it or set FERN_BIN');
}

// Starts `fern serve --port 0 ...args`; resolves once it prints the address it serves on.
export function startServer(args = [], { env = {} } = {}) {
  const bin = findBinary();
  const proc = spawn(bin, ['serve', '--port', '0', '--threads', '1', ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => {
    stderr += d.toString();
    if (process.env.FERN_TEST_VERBOSE) process.stderr.write(d);
  });
  const exited = new Promise((res) => proc.on('exit', (code, signal) => res({ code, signal })));
  return new Promise((resolveStart, rejectStart) => {
    let out = '';
    const timer = setTimeout(() => rejectStart(new Error(`fern serve did not start in 60 s:\n${stderr}`)), 60000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/on (http:\/\/[^\s]+)\/v1/);
      if (m) {
        clearTimeout(timer);
        const base = m[1];
        resolveStart({
          proc,
          base,
          baseURL: `${base}/v1`,
          exited,
          stderr: () => stderr,
          async stop() {
            if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
            await exited;
          },
        });
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      rejectStart(new Error(`fern serve exited with ${code} before serving:\n${stderr}`));
    });
  });
}

export function client(server, opts = {}) {
  return new OpenAI({ baseURL: server.baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 60000, ...opts });
}

export const MODEL = 'fern-demo';

export async function metric(server, name) {
  const text = await (await fetch(`${server.base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line ? Number(line.split(' ').pop()) : undefined;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
