// Starting `kvlm serve` for the tests: the binary ($KVLM_BIN, or built
// into a work folder with `go build`) and a server on a free port.

import { spawn, execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const shared = process.env.KVLM_SHARED || path.resolve(repo, '..', 'shared');

// kvlmBin is $KVLM_BIN, or kvlm built into dir.
export function kvlmBin(dir) {
  let bin = process.env.KVLM_BIN;
  if (!bin) {
    bin = path.join(dir, 'kvlm');
    execFileSync('go', ['build', '-o', bin, './cmd/kvlm'], { cwd: repo, stdio: 'inherit' });
  }
  return bin;
}

// serve runs `kvlm serve ARGS --addr 127.0.0.1:0` with env added and
// resolves to { server, baseURL } once it listens.
export function serve(bin, args, env = {}) {
  const server = spawn(bin, ['serve', ...args, '--addr', '127.0.0.1:0'], { stdio: ['ignore', 'inherit', 'pipe'], env: { ...process.env, ...env } });
  return new Promise((resolve, reject) => {
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 60000);
    server.stderr.on('data', (d) => {
      log += d;
      process.stderr.write(d);
      const m = log.match(/listening on (http:\/\/\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ server, baseURL: m[1] });
      }
    });
    server.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
}

// stop sends SIGTERM and resolves to the exit code.
export async function stop(server) {
  if (!server || server.exitCode !== null) return server?.exitCode;
  const exited = new Promise((resolve) => server.on('exit', resolve));
  server.kill('SIGTERM');
  return exited;
}
