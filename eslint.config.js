// typescript-eslint's recommended rules, with type information where it catches real bugs
// (floating promises: a lost await in a durable engine is a lost write). Formatting is
// prettier's job (npm run format:check), so no stylistic rules here.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  // bench/ is its own package (its own dependencies and tsconfig), linted by its typecheck only.
  // test/workflow-world/suite/ is its own package too (the Workflow SDK's suite, on vitest 4).
  { ignores: ['dist/', 'node_modules/', 'bench/', '.runledger/', 'test/workflow-world/suite/node_modules/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      // A variable declared first and assigned later is how a closure refers to what it starts.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      // The engine handles untyped rows and user values at its boundaries on purpose.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    files: ['**/*.js', '**/*.cjs', '**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: {
        module: 'writable',
        require: 'readonly',
        process: 'readonly',
        console: 'readonly',
        URL: 'readonly',
        fetch: 'readonly',
        Buffer: 'readonly',
      },
    },
  },
);
