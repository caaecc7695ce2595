"""Developer and demo tools: never imported by the engine (a node needs none of them).

* :mod:`scheduler.devtools.demo`: ``scheduler demo``, the whole engine on a
  private PostgreSQL, end to end (the CLI imports it only for that command);
* :mod:`scheduler.devtools.embedded`: a private, throwaway PostgreSQL server
  (the demo's store, and the tests');
* :mod:`scheduler.devtools.etcd_server`: a throwaway single-member etcd (tests
  and benchmarks).

They may import the engine; nothing in the engine imports them.
"""
