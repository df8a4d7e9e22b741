// Unit tests of the lab extension's pure logic (labextension/test), run by `jlpm test`.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['labextension/test/**/*.test.ts'],
    environment: 'node'
  }
});
