"""A TCP proxy that counts bytes each way; one line per closed connection: '<up> <down>'."""
import asyncio
import sys

listen_port, target_port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


async def pipe(reader, writer, counter, index):
    try:
        while data := await reader.read(65536):
            counter[index] += len(data)
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer):
    server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
    counter = [0, 0]
    await asyncio.gather(
        pipe(client_reader, server_writer, counter, 0),
        pipe(server_reader, client_writer, counter, 1),
    )
    with open(out, "a") as f:
        f.write(f"{counter[0]} {counter[1]}\n")


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


asyncio.run(main())
