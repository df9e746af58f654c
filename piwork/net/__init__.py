"""The networks people have: an upstream proxy, extra certificate authorities, mirrors.

* :mod:`piwork.net.upstream`: the HTTP CONNECT or SOCKS5 proxy the model
  gateway and the egress proxy go through (settings, the environment, the
  system), with ``NO_PROXY``; credentials from the keyring, never in the VM.
* :mod:`piwork.net.cas`: the certificate authorities the host trusts beyond
  the public ones, plus those the person adds; trusted by the gateway and
  installed in the guest's stores (certificates only, never a private key).
* :mod:`piwork.net.mirrors`: package mirrors (PyPI, npm, Debian) for a folder
  or for everyone, used by the guest's pip, npm and apt.
* :mod:`piwork.net.guest`: what the guest gets of all that at start.
* :mod:`piwork.net.config`: the ``network`` section of settings.json.
"""
