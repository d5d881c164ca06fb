// The book's live explorers (attnbook.explorers.live): loaded by an explorer's "live" switch, never before.
// Switched on, it loads onnxruntime-web (ort.wasm.min.js, served by the book from _static/live/), the
// explorer's spec (<name>.json) and graph (<name>.onnx), builds the explorer's controls in place of the
// scrubber's, runs the graph on every change and draws the outputs on a canvas with the figures' colormaps.
// Switched off, the scrubber is back as it was. When anything fails the scrubber stays and the switch's note
// says why in one line (the messages are the switch's data-msg-* attributes, in the page's language).
// The numbers drawn are exposed for tests: window.attnbookLive[<explorer id>].lastOutput.
(function () {
  'use strict';
  var live = window.attnbookLive = window.attnbookLive || {};
  var runtime = null;  // the promise of onnxruntime-web, loaded once per page

  function note(box, key, detail) {
    var text = box.dataset[key] || key;
    box.querySelector('.ab-live-note').textContent = detail ? text + ' (' + detail + ')' : text;
  }

  function loadScript(src) {
    return new Promise(function (resolve, reject) {
      var s = document.createElement('script');
      s.src = src;
      s.onload = resolve;
      s.onerror = function () { reject(new Error('msgMissing:' + src.split('/').pop())); };
      document.head.appendChild(s);
    });
  }

  function loadRuntime(base) {
    if (!runtime) {
      runtime = loadScript(base + 'ort.wasm.min.js').then(function () {
        var ort = window.ort;
        // the book's own copy, ort-wasm-simd-threaded.{mjs,wasm}: an absolute URL, as the runtime resolves a
        // relative one against its own script's address, not the page's
        ort.env.wasm.wasmPaths = new URL(base, location.href).href;
        ort.env.wasm.numThreads = 1;  // no cross-origin isolation on a static site: one thread
        ort.env.wasm.proxy = false;
        return ort;
      });
      runtime.catch(function () { runtime = null; });  // a later switch tries again
    }
    return runtime;
  }

  function fetchOk(url, how) {
    return fetch(url).then(function (r) {
      if (!r.ok) { throw new Error('msgMissing:' + url.split('/').pop()); }
      return how === 'json' ? r.json() : r.arrayBuffer();
    }, function () { throw new Error('msgMissing:' + url.split('/').pop()); });
  }

  function decode(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    return new Float32Array(bytes.buffer);
  }

  // -- drawing ---------------------------------------------------------------------------------------------
  function heatmap(ctx, x0, y0, size, data, n, cmap, vmin, vmax, title) {
    var cell = size / n;
    for (var r = 0; r < n; r++) {
      for (var c = 0; c < n; c++) {
        var v = (data[r * n + c] - vmin) / (vmax - vmin);
        var k = Math.max(0, Math.min(cmap.length - 1, Math.round(v * (cmap.length - 1))));
        ctx.fillStyle = cmap[k];
        ctx.fillRect(x0 + c * cell, y0 + r * cell, Math.ceil(cell), Math.ceil(cell));
      }
    }
    ctx.strokeStyle = '#000';
    ctx.lineWidth = 1;
    ctx.strokeRect(x0 + 0.5, y0 + 0.5, size - 1, size - 1);
    ctx.fillStyle = '#000';
    ctx.font = '13px sans-serif';
    ctx.textAlign = 'center';
    ctx.fillText(title, x0 + size / 2, y0 - 8);
    ctx.font = '12px sans-serif';
    ctx.fillText('key j', x0 + size / 2, y0 + size + 30);
    var step = Math.max(1, Math.ceil(n / 8));
    for (var t = 0; t < n; t += step) {
      ctx.fillText(String(t), x0 + (t + 0.5) * cell, y0 + size + 14);
      ctx.textAlign = 'right';
      ctx.fillText(String(t), x0 - 4, y0 + (t + 0.5) * cell + 4);
      ctx.textAlign = 'center';
    }
    ctx.save();
    ctx.translate(x0 - 26, y0 + size / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText('query i', 0, 0);
    ctx.restore();
  }

  // -- each live explorer: its feeds from the controls' values, and how its outputs are drawn ---------------
  var EXPLORERS = {
    masks: {
      // the controls that apply to a kind (as the notebook's widget disables the others), and their ranges
      limits: function (spec, v) {
        return {window: spec.windowed.indexOf(v.kind) >= 0 ? [0, v.T - 1] : null,
                length: spec.padded.indexOf(v.kind) >= 0 ? [1, v.T] : null};
      },
      feeds: function (ort, spec, v) {
        var inp = spec.inputs[String(v.T)], E = inp.d_model;
        return {
          x: new ort.Tensor('float32', decode(inp.x), [v.T, E]),
          wq: new ort.Tensor('float32', decode(inp.wq), [E, E]),
          wk: new ort.Tensor('float32', decode(inp.wk), [E, E]),
          flags: new ort.Tensor('bool', Uint8Array.from(spec.flags[v.kind].map(Number)), [3]),
          window: new ort.Tensor('int64', BigInt64Array.from([BigInt(v.window)]), []),
          length: new ort.Tensor('int64', BigInt64Array.from([BigInt(v.length)]), [])
        };
      },
      output: function (spec, v, out) {
        var T = v.T, mask = Array.from(out.mask.data, Number), weights = Array.from(out.weights.data);
        var allowed = 0, empty = 0;
        for (var r = 0; r < T; r++) {
          var any = 0;
          for (var c = 0; c < T; c++) { allowed += mask[r * T + c]; any += mask[r * T + c]; }
          if (!any) { empty += 1; }
        }
        var caption = v.kind + ', T = ' + T +
          (spec.windowed.indexOf(v.kind) >= 0 ? ', window = ' + v.window : '') +
          (spec.padded.indexOf(v.kind) >= 0 ? ', real length = ' + v.length : '') +
          ': ' + allowed + ' of ' + T * T + ' (query, key) pairs allowed; ' + empty + ' query row' +
          (empty === 1 ? '' : 's') + ' with no key (their weights are all 0, not NaN)';
        // as the explorer's caption ends: the controls that do not apply to this kind
        var off = spec.controls.filter(function (c) {
          return (c.name === 'window' && spec.windowed.indexOf(v.kind) < 0) ||
            (c.name === 'length' && spec.padded.indexOf(v.kind) < 0);
        }).map(function (c) { return c.label; });
        if (off.length) { caption += '; ' + off.join(' and ') + (off.length === 1 ? ' does' : ' do') + ' not apply here'; }
        return {setting: Object.assign({}, v), mask: mask, weights: weights, allowed: allowed, empty_rows: empty,
                caption: caption};
      },
      draw: function (spec, canvas, o) {
        var ctx = canvas.getContext('2d'), W = canvas.width, size = 190;
        ctx.clearRect(0, 0, W, canvas.height);
        ctx.fillStyle = '#fff';
        ctx.fillRect(0, 0, W, canvas.height);
        ctx.fillStyle = '#000';
        ctx.font = '14px sans-serif';
        ctx.textAlign = 'center';
        ctx.fillText(o.setting.kind, W / 2, 16);
        heatmap(ctx, 50, 44, size, o.mask, o.setting.T, spec.colormaps.Greys_r, 0, 1, 'mask (white = may attend)');
        heatmap(ctx, 50 + size + 70, 44, size, o.weights, o.setting.T, spec.colormaps.viridis, 0, 1,
                'attention weights');
      },
      size: [520, 290]
    }
  };

  // -- one explorer's live panel ------------------------------------------------------------------------------
  function Panel(box, root, spec, session, ort) {
    var self = this, kind = EXPLORERS[spec.name];
    this.values = {};
    this.busy = null;
    this.pending = false;
    var panel = document.createElement('div');
    panel.className = 'ab-live-panel';
    spec.controls.forEach(function (c) {
      self.values[c.name] = c.value;
      var row = document.createElement('div');
      row.className = 'ab-live-control';
      row.style.cssText = 'display:flex;flex-wrap:wrap;align-items:center;column-gap:0.6em;margin:2px 0';
      var label = document.createElement('span');
      label.textContent = c.label;
      label.style.cssText = 'flex:none;min-width:' + (Math.max.apply(null, spec.controls.map(function (d) {
        return d.label.length; })) + 1) + 'ch';
      row.appendChild(label);
      var input;
      if (c.type === 'select') {
        input = document.createElement('select');
        c.options.forEach(function (o) {
          var opt = document.createElement('option');
          opt.value = opt.textContent = o;
          input.appendChild(opt);
        });
        input.value = c.value;
      } else {
        input = document.createElement('input');
        input.type = 'range';
        input.min = c.min;
        input.max = c.max;
        input.step = 1;
        input.value = c.value;
        input.style.cssText = 'flex:none;margin:0;width:16em;max-width:60vw';
      }
      input.dataset.name = c.name;
      input.className = 'ab-live-input';
      input.setAttribute('aria-label', c.label);
      var value = document.createElement('output');
      value.className = 'ab-live-value';
      value.style.cssText = 'flex:none;min-width:4ch';
      input.addEventListener('input', function () {
        self.values[c.name] = c.type === 'range' ? Number(input.value) : input.value;
        self.update();
      });
      row.appendChild(input);
      if (c.type === 'range') { row.appendChild(value); }
      panel.appendChild(row);
    });
    var canvas = document.createElement('canvas');
    canvas.width = kind.size[0];
    canvas.height = kind.size[1];
    canvas.style.cssText = 'display:block;width:' + kind.size[0] + 'px;max-width:100%;height:auto';
    canvas.setAttribute('role', 'img');
    panel.appendChild(canvas);
    var caption = document.createElement('div');
    caption.className = 'ab-live-caption';
    caption.style.fontSize = '90%';
    panel.appendChild(caption);
    root.appendChild(panel);
    this.panel = panel;
    this.update = function () {
      if (self.busy) { self.pending = true; return self.busy; }
      // clamp each control to the range the others allow (window < T, length <= T) and disable what does not apply
      var lim = kind.limits(spec, self.values);
      panel.querySelectorAll('.ab-live-input').forEach(function (input) {
        var name = input.dataset.name, range = lim[name];
        if (range === undefined) { return; }
        input.disabled = range === null;
        input.parentNode.style.opacity = range === null ? '0.5' : '';
        if (range !== null) {
          input.min = range[0];
          input.max = range[1];
          self.values[name] = Math.max(range[0], Math.min(range[1], self.values[name]));
          input.value = self.values[name];
        }
      });
      panel.querySelectorAll('.ab-live-input').forEach(function (input) {
        var out = input.parentNode.querySelector('.ab-live-value');
        if (out) { out.textContent = input.value; }
      });
      var v = Object.assign({}, self.values), started = performance.now();
      self.busy = session.run(kind.feeds(ort, spec, v)).then(function (out) {
        var o = kind.output(spec, v, out);
        kind.draw(spec, canvas, o);
        caption.textContent = o.caption;
        o.ms = performance.now() - started;
        live[root.id].lastOutput = o;
        live[root.id].frames += 1;
        self.busy = null;
        if (self.pending) { self.pending = false; return self.update(); }
      }, function (err) {
        self.busy = null;
        live.toggle(box, false);
        box.querySelector('.ab-live-switch').checked = false;
        note(box, 'msgFailed', String(err && err.message || err).slice(0, 120));
      });
      return self.busy;
    };
  }

  function scrubberParts(root) {
    return Array.prototype.filter.call(root.children, function (el) {
      return !el.classList.contains('ab-live') && !el.classList.contains('ab-live-panel') &&
        el !== root.firstElementChild;  // the title stays
    });
  }

  function show(root, on) {
    scrubberParts(root).forEach(function (el) {
      if (on) { el.dataset.liveHidden = el.style.display; el.style.display = 'none'; }
      else if (el.dataset.liveHidden !== undefined) { el.style.display = el.dataset.liveHidden; delete el.dataset.liveHidden; }
    });
    var f = root.querySelectorAll('.ab-frame');
    if (!on) {  // the scrubber's own script decides which frame shows: run it again
      var r = root.querySelector('input.ab-range');
      if (r) { r.dispatchEvent(new Event('input')); }
      else if (f.length === 1) { f[0].style.display = ''; }
    }
  }

  function start(box) {
    var root = box.closest('.attnbook-explorer'), base = box.dataset.base, name = box.dataset.live;
    var state = live[root.id] = live[root.id] || {frames: 0, lastOutput: null, panel: null};
    if (state.panel) { return Promise.resolve(state); }
    if (typeof WebAssembly !== 'object' || typeof BigInt64Array === 'undefined') {
      return Promise.reject(new Error('msgNowasm'));
    }
    note(box, 'msgLoading');
    state.started = performance.now();
    return Promise.all([loadRuntime(base), fetchOk(base + name + '.json', 'json')]).then(function (got) {
      var ort = got[0], spec = got[1];
      return fetchOk(base + spec.graph, 'buffer').then(function (buf) {
        return ort.InferenceSession.create(buf, {executionProviders: ['wasm']});
      }).then(function (session) {
        state.panel = new Panel(box, root, spec, session, ort);
        state.spec = spec;
        return state;
      });
    });
  }

  live.toggle = function (box, on) {
    var root = box.closest('.attnbook-explorer'), sw = box.querySelector('.ab-live-switch');
    var state = live[root.id];
    if (!on) {
      if (state && state.panel) { state.panel.panel.style.display = 'none'; }
      show(root, false);
      if (!box.querySelector('.ab-live-note').textContent.length || box.dataset.state === 'on') { note(box, 'msgOff'); }
      box.dataset.state = 'off';
      return Promise.resolve(null);
    }
    return start(box).then(function (st) {
      if (!sw.checked) { return st; }  // switched off again while loading
      st.panel.panel.style.display = '';
      show(root, true);
      box.dataset.state = 'on';
      return st.panel.update().then(function () {
        if (st.firstFrameMs === undefined) { st.firstFrameMs = performance.now() - st.started; }
        note(box, 'msgOn');
        return st;
      });
    }).catch(function (err) {
      var m = String(err && err.message || err), key = m.split(':')[0];
      sw.checked = false;
      show(root, false);
      box.dataset.state = 'failed';
      if (key === 'msgMissing' || key === 'msgNowasm') { note(box, key, m.split(':').slice(1).join(':')); }
      else { note(box, 'msgFailed', m.slice(0, 120)); }
      return null;
    });
  };
})();
