// A recorded terminal session played in the page (asciicast v2 through asciinema-player),
// fetched with the session's token. Loaded only when a Replay button is pressed.
import { useEffect, useRef, useState } from "preact/hooks";
import * as AsciinemaPlayer from "asciinema-player";
import "asciinema-player/dist/bundle/asciinema-player.css";
import { raw } from "../api/client";
import { ErrorNote } from "../ui";

declare global {
  interface Window {
    sandbaseReplay?: { state: string; text: string };
  }
}

export default function Replay({ recording }: { recording: string }) {
  const box = useRef<HTMLDivElement>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    const probe = (window.sandbaseReplay = { state: "loading", text: "" });
    let player: AsciinemaPlayer.Player | null = null;
    let live = true;
    raw(`/v1/recordings/${recording}`, { headers: { accept: "application/x-asciicast" } })
      .then((answer) => answer.text())
      .then((cast) => {
        if (!live) return;
        player = AsciinemaPlayer.create({ data: cast }, box.current!, { autoPlay: true, idleTimeLimit: 1, fit: "width", controls: true });
        player.addEventListener("play", () => (probe.state = "playing"));
        player.addEventListener("ended", () => {
          probe.state = "ended";
          probe.text = box.current?.innerText ?? "";
        });
      })
      .catch((failure) => {
        probe.state = "failed";
        setError(failure);
      });
    return () => {
      live = false;
      player?.dispose();
    };
  }, [recording]);
  return (
    <div class="replay">
      <ErrorNote error={error} />
      <div ref={box} data-testid="replay" />
    </div>
  );
}
