// docs.js - the API explorer at /docs: Swagger UI over this server's own
// /v1/openapi.json. "Try it out" calls go to the server that served the
// page (whatever the document's servers list says), with the token the
// status page keeps for this tab (sessionStorage) when there is one; the
// Authorize button sets another. Nothing is fetched from elsewhere.
'use strict';

(function () {
  const TOKEN_KEY = 'trainyard.token'; // the status page's key (api.js)
  const status = document.getElementById('docs-status');

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }

  async function load() {
    const r = await fetch('/v1/openapi.json', { cache: 'no-store' });
    if (!r.ok) throw new Error('GET /v1/openapi.json answered ' + r.status);
    return r.json();
  }

  function start(spec) {
    spec.servers = [{ url: location.origin, description: 'this trainyardd' }];
    window.tyDocs = window.SwaggerUIBundle({
      spec,
      dom_id: '#swagger-ui',
      presets: [window.SwaggerUIBundle.presets.apis],
      layout: 'BaseLayout',
      deepLinking: true,
      validatorUrl: null,      // no badge fetched from elsewhere
      displayRequestDuration: true,
      defaultModelsExpandDepth: 0,
      onComplete: () => {
        const t = token();
        if (t) window.tyDocs.preauthorizeApiKey('bearer', t);
        status.textContent = spec.info.title + ' ' + spec.info.version + ': ' +
          Object.keys(spec.paths).length + ' paths';
      },
    });
  }

  load().then(start).catch((e) => {
    status.textContent = 'The API document could not be loaded: ' + e.message +
      '. Is trainyardd still running?';
    status.classList.add('error');
  });
})();
